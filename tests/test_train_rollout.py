"""The KV-cache sampler: exact categorical / nucleus sampling, greedy agreement with
``model.generate``, stopping and ordering."""

from __future__ import annotations

import pytest
import torch

from gear_rl.models import build_tiny_tokenizer, tiny_random_model
from gear_rl.train.rollout import sample_next_token, sample_responses, stop_token_ids


def test_tiny_top_p_is_greedy() -> None:
    logits = torch.randn(16, 300)
    tokens = sample_next_token(logits, top_p=1e-9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampling_frequencies_match_the_nucleus_distribution(top_p: float) -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    probs = torch.softmax(logits / 0.7, -1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]
    kept = torch.zeros_like(probs)
    kept[order] = (before < top_p).float()
    target = probs * kept / (probs * kept).sum()
    n = 200_000
    tokens = sample_next_token(logits.expand(n, -1), temperature=0.7, top_p=top_p,
                               generator=torch.Generator().manual_seed(1), nucleus_topk=3)
    freq = torch.bincount(tokens, minlength=6).float() / n
    assert torch.allclose(freq, target, atol=4e-3), (freq, target)
    assert bool((freq[kept == 0] == 0).all())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="temperature"):
        sample_next_token(torch.zeros(1, 4), temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        sample_next_token(torch.zeros(1, 4), top_p=0.0)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample_next_token(torch.zeros(4))


@pytest.fixture(scope="module")
def tiny():
    model = tiny_random_model("llama", seed=3, initializer_range=0.3).eval()
    return model, build_tiny_tokenizer()


def _prompts(tokenizer, n: int) -> list[list[int]]:
    texts = ["hi", "a longer prompt here", "x", "what is 3 + 4?", "ok", "?!"]
    return [tokenizer(t * (1 + i % 3), add_special_tokens=False)["input_ids"]
            for i, t in enumerate(texts[:n])]


def test_greedy_equals_model_generate(tiny) -> None:
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6)
    stops = stop_token_ids(tokenizer, model)
    ours = sample_responses(model, prompts, max_new_tokens=20, stop_ids=stops,
                            pad_id=tokenizer.pad_token_id, top_p=1e-9,
                            generator=torch.Generator().manual_seed(0))
    for row, prompt in enumerate(prompts):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                                   eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
        expected = reference[0, len(prompt):].tolist()
        cut = next((i for i, t in enumerate(expected) if t in stops), None)
        expected = expected if cut is None else expected[:cut + 1]
        assert ours.response_ids[row] == expected
        assert ours.finished[row] == (cut is not None)


def test_stops_keep_order_and_are_reproducible(tiny) -> None:
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6) * 4
    stops = stop_token_ids(tokenizer, model)
    common = {"max_new_tokens": 12, "stop_ids": stops, "pad_id": tokenizer.pad_token_id,
              "temperature": 1.5}
    a = sample_responses(model, prompts, generator=torch.Generator().manual_seed(5), **common)
    b = sample_responses(model, prompts, generator=torch.Generator().manual_seed(5), **common)
    assert a.response_ids == b.response_ids
    for response, finished in zip(a.response_ids, a.finished, strict=True):
        assert 1 <= len(response) <= 12
        assert not any(t in stops for t in response[:-1])
        assert finished == (response[-1] in stops)
    chunked = sample_responses(model, prompts, generator=torch.Generator().manual_seed(5),
                               batch_size=7, **common)
    assert len(chunked.response_ids) == len(prompts)


def test_stop_token_ids_of_tiny_tokenizer(tiny) -> None:
    _, tokenizer = tiny
    vocab = tokenizer.get_vocab()
    assert vocab["<|im_end|>"] in stop_token_ids(tokenizer)
