"""The sampler's CPU decode attention (``gear_rl.sampling.attention``): the same numbers as
transformers' SDPA path for one query per row (grouped heads, bool, additive and no mask, fp32
and bf16), SDPA itself for everything it does not handle, the model's attention setting
restored on exit (also on an error) and left alone for other implementations, and the sampler
decoding the same tokens with and without it."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from gear_rl.models import build_tiny_tokenizer, tiny_random_model
from gear_rl.sampling import (
    DECODE_ATTENTION,
    SamplingParams,
    decode_attention,
    sample_continuations,
    sample_responses,
    stop_token_ids,
)
from gear_rl.sampling.attention import _decode_attention_forward

pytestmark = pytest.mark.usefixtures("one_thread")


class _Heads(torch.nn.Module):
    """What transformers' SDPA function reads from an attention module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(rows: int, heads: int, kv_heads: int, length: int, dim: int, dtype: torch.dtype,
            queries: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, queries, dim, generator=g).to(dtype)
    k = torch.randn(rows, kv_heads, length, dim, generator=g).to(dtype)
    v = torch.randn(rows, kv_heads, length, dim, generator=g).to(dtype)
    # left padding: row r attends its last length - 3 * r positions (at least one)
    keep = torch.arange(length)[None, :] >= (3 * torch.arange(rows))[:, None].clamp(max=length - 1)
    return q, k, v, keep[:, None, None, :]


def _reference(q, k, v, keep) -> torch.Tensor:
    """float64 attention with every query head against its key-value head: ``[R, 1, H, D]``."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = q.double() @ k64.transpose(-1, -2) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, -1) @ v64).transpose(1, 2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4), (8, 1)])
def test_matches_sdpa_for_one_query(dtype, tol, mask_kind, heads, kv_heads) -> None:
    q, k, v, keep = _inputs(6, heads, kv_heads, 37, 16, dtype)
    if mask_kind == "none":
        keep = torch.ones_like(keep)
        mask = None
    elif mask_kind == "bool":
        mask = keep
    else:
        mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    module = _Heads(heads // kv_heads)
    with torch.no_grad():
        ours, _ = _decode_attention_forward(module, q, k, v, mask)
        theirs, _ = sdpa_attention_forward(module, q, k, v, mask)
    assert ours.shape == theirs.shape == (6, 1, heads, 16)
    assert ours.dtype == dtype
    exact = _reference(q, k, v, keep)
    ours_err = (ours.double() - exact).abs().max().item()
    theirs_err = (theirs.double() - exact).abs().max().item()
    assert ours_err <= tol
    assert ours_err <= max(theirs_err, 1e-6) * 1.5  # no less accurate than SDPA


@pytest.mark.parametrize("case", ["prefill", "grad", "dropout", "window", "mask_length"])
def test_anything_else_goes_to_sdpa_unchanged(case) -> None:
    """More than one query, gradients, dropout, a sliding window or a mask that is not one per
    key (here one that broadcasts) are transformers' SDPA call itself, bit for bit."""
    q, k, v, keep = _inputs(3, 4, 2, 20, 8, torch.float32, queries=5 if case == "prefill" else 1)
    mask = {"prefill": torch.ones(3, 1, 5, 20, dtype=torch.bool),
            "mask_length": keep[..., -1:]}.get(case, keep)
    kwargs = {"dropout": {"dropout": 0.5}, "window": {"sliding_window": 4}}.get(case, {})
    module = _Heads(2)
    state = torch.random.get_rng_state()
    with torch.set_grad_enabled(case == "grad"):
        ours, _ = _decode_attention_forward(module, q, k, v, mask, **kwargs)
        torch.random.set_rng_state(state)  # the same dropout draws
        theirs, _ = sdpa_attention_forward(module, q, k, v, mask, **kwargs)
    assert torch.equal(ours, theirs)


@pytest.fixture(scope="module")
def tiny():
    model = tiny_random_model("qwen2", seed=5, num_heads=8, num_kv_heads=2,
                              initializer_range=0.3).eval()
    return model, build_tiny_tokenizer()


def test_switches_the_attention_and_restores_it(tiny) -> None:
    model, _ = tiny
    assert model.config._attn_implementation == "sdpa"
    with decode_attention(model):
        assert model.config._attn_implementation == DECODE_ATTENTION
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(KeyError), decode_attention(model):
        raise KeyError("boom")
    assert model.config._attn_implementation == "sdpa"
    with decode_attention(model, enabled=False):
        assert model.config._attn_implementation == "sdpa"


def test_other_implementations_are_left_alone() -> None:
    model = tiny_random_model("llama", seed=1)
    model.config._attn_implementation = "eager"
    with decode_attention(model):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "eager"


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["hi", "a much longer prompt than the others here", "what is 3 + 4?", "ok ok"]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_sampler_decodes_the_same_tokens(tiny) -> None:
    """Greedy and sampled rows (left-padded, repeated prompts, rows stopping at different
    steps) and continuations are the same tokens with the fast path and with SDPA (fp32), and
    the model's setting is SDPA again afterwards."""
    model, tokenizer = tiny
    prompts = [p for p in _prompts(tokenizer) for _ in range(3)]
    free = sample_responses(model, prompts, SamplingParams(
        max_new_tokens=24, stop_ids=[], pad_id=tokenizer.pad_token_id, greedy=True)).response_ids
    # stop tokens that greedy rows write at different steps (a random model rarely ends a turn)
    stops = set(stop_token_ids(tokenizer, model))
    for row, step in ((0, 3), (3, 9), (9, 15)):
        if free[row][step] not in free[row][:step]:
            stops.add(free[row][step])
    common = {"max_new_tokens": 24, "stop_ids": stops, "pad_id": tokenizer.pad_token_id}
    for mode in ({"greedy": True}, {"temperature": 1.0, "top_p": 0.95}):
        runs = [sample_responses(model, prompts,
                                 SamplingParams(fast_attention=fast, **common, **mode),
                                 generator=torch.Generator().manual_seed(3))
                for fast in (True, False)]
        assert runs[0].response_ids == runs[1].response_ids
        assert runs[0].finished == runs[1].finished
        assert len({len(r) for r in runs[0].response_ids}) > 1
    sequence = prompts[3] + prompts[6]
    cuts = [2, len(sequence) // 2, len(sequence)]
    runs = [sample_continuations(model, sequence, cuts, 3,
                                 SamplingParams(fast_attention=fast, **common),
                                 generator=torch.Generator().manual_seed(4))
            for fast in (True, False)]
    assert [r.response_ids for r in runs[0]] == [r.response_ids for r in runs[1]]
    assert model.config._attn_implementation == "sdpa"


def test_decode_really_uses_the_fast_path(tiny, monkeypatch) -> None:
    """The sampler's decoding steps (one query, no gradient) run the grouped path: it is
    called once per layer per step after the prefill, which stays on SDPA."""
    model, tokenizer = tiny
    calls = {"fast": 0, "sdpa": 0}
    real_fast = _decode_attention_forward

    def counting(module, query, *args, **kwargs):
        calls["fast" if query.shape[2] == 1 else "sdpa"] += 1
        return real_fast(module, query, *args, **kwargs)

    from transformers import AttentionInterface

    monkeypatch.setitem(AttentionInterface._global_mapping, DECODE_ATTENTION, counting)
    prompts = _prompts(tokenizer)
    result = sample_responses(model, prompts, SamplingParams(
        max_new_tokens=6, stop_ids=[], pad_id=tokenizer.pad_token_id, greedy=True))
    assert all(len(r) == 6 for r in result.response_ids)
    layers = model.config.num_hidden_layers
    assert calls["fast"] == 5 * layers  # decoding steps 2..6 (the prefill gives the first)
    assert calls["sdpa"] == 0
