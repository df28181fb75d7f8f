"""The KV-cache sampler (``gear_rl.sampling``): exact categorical / nucleus sampling, greedy
agreement with ``model.generate``, stopping and ordering, shared-prompt prefill, continuations
of one sequence's prefixes from its single cache (``sample_continuations``), the
:class:`SamplingParams` record and the turn cache."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gear_rl.models import build_tiny_tokenizer, tiny_random_model
from gear_rl.sampling import (
    RowStop,
    SamplingParams,
    TurnCache,
    continue_sequences,
    sample_continuations,
    sample_next_token,
    sample_responses,
    stop_token_ids,
)


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


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    model = tiny_random_model("llama", seed=3, initializer_range=0.3).eval()
    return model, build_tiny_tokenizer()


def _prompts(tokenizer, n: int) -> list[list[int]]:
    texts = ["hi", "a longer prompt here", "x", "what is 3 + 4?", "ok", "?!"]
    return [tokenizer(t * (1 + i % 3), add_special_tokens=False)["input_ids"]
            for i, t in enumerate(texts[:n])]


def _generate_greedy(model, prompt: list[int], max_new_tokens: int, pad_id: int) -> list[int]:
    """``model.generate(do_sample=False)`` from one prompt, with no stop token."""
    ids = torch.tensor([prompt])
    reference = model.generate(ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=pad_id)
    return reference[0, len(prompt):].tolist()


def _cut(tokens: list[int], stops: list[int]) -> tuple[list[int], bool]:
    """``tokens`` up to and including the first stop token, and whether there was one (what
    ``generate`` returns with those stop ids, its greedy tokens before a stop being the same)."""
    cut = next((i for i, t in enumerate(tokens) if t in stops), None)
    return (tokens, False) if cut is None else (tokens[:cut + 1], True)


def _stops_that_fire(model, tokenizer, free: list[list[int]]) -> list[int]:
    """End-of-turn ids plus tokens the greedy answers ``free`` write at different steps, so that
    greedy rows stop at different steps (a random model rarely writes its end-of-turn token)."""
    stops = set(stop_token_ids(tokenizer, model))
    for row, step in ((0, 2), (2, 6), (3, 11)):
        if free[row][step] not in free[row][:step]:
            stops.add(free[row][step])
    return sorted(stops)


@pytest.mark.parametrize("greedy", [True, False])
def test_greedy_equals_model_generate(tiny, greedy: bool) -> None:
    """greedy=True, and the old spelling (a vanishing top-p nucleus), are model.generate's greedy
    search, on a batch of prompts of several lengths (left padding) with repeats (prompts
    prefilled once, their cache rows repeated) and rows stopping at different steps."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6)
    batch = [prompts[i] for i in (0, 1, 1, 2, 3, 0, 4, 5, 1)]
    free = [_generate_greedy(model, p, 20, tokenizer.pad_token_id) for p in prompts]
    stops = _stops_that_fire(model, tokenizer, free)
    mode = {"greedy": True} if greedy else {"top_p": 1e-9}
    sampling = SamplingParams(max_new_tokens=20, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                              **mode)
    ours = sample_responses(model, batch, sampling, generator=torch.Generator().manual_seed(0))
    assert ours.prompt_ids == batch
    expected = {tuple(p): _cut(f, stops) for p, f in zip(prompts, free, strict=True)}
    for row, prompt in enumerate(batch):
        assert (ours.response_ids[row], ours.finished[row]) == expected[tuple(prompt)]
    assert len({len(r) for r in ours.response_ids}) > 1  # rows stopped at different steps
    assert any(ours.finished) and not all(ours.finished)


@pytest.mark.parametrize("full_layers", [0, 1])
def test_greedy_with_a_sliding_window_layer_equals_generate(full_layers: int) -> None:
    """A model with sliding-window layers (their cache keeps only the window; they are not put
    in the sampler's buffers) decodes, past the window and on a left-padded batch, what greedy
    decoding without any cache gives (a full forward over the growing sequence per token),
    also when the first layer is a sliding one. (With every layer sliding, transformers 5.10's
    ``generate`` itself departs from that reference after about ten tokens on some prompts.)"""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         use_sliding_window=True, sliding_window=6,
                         max_window_layers=full_layers, initializer_range=0.3,
                         eos_token_id=258, pad_token_id=256)
    assert config.layer_types == ["full_attention"] * full_layers + ["sliding_attention"] * (
        2 - full_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).eval()
    tokenizer = build_tiny_tokenizer()
    prompts = _prompts(tokenizer, 4)
    batch = [prompts[i] for i in (0, 1, 1, 3, 2)]
    free = []
    for prompt in prompts:
        sequence = list(prompt)
        with torch.no_grad():
            for _ in range(14):
                sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
        free.append(sequence[len(prompt):])
    stops = _stops_that_fire(model, tokenizer, free)
    ours = sample_responses(model, batch, SamplingParams(
        max_new_tokens=14, stop_ids=stops, pad_id=tokenizer.pad_token_id, greedy=True))
    for row, prompt in enumerate(batch):
        expected = _cut(free[prompts.index(prompt)], stops)
        assert (ours.response_ids[row], ours.finished[row]) == expected
    with pytest.raises(ValueError, match="sliding window"):
        sample_continuations(model, prompts[1], [3], 2, SamplingParams(
            max_new_tokens=4, stop_ids=stops, pad_id=tokenizer.pad_token_id))


def test_greedy_equals_batched_generate_token_for_token(tiny) -> None:
    """On one left-padded batch, greedy rows equal ``model.generate(do_sample=False)``'s rows on
    the same batch up to their first stop token; chunking does not change them."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6) * 2
    free = [_generate_greedy(model, p, 16, tokenizer.pad_token_id) for p in prompts[:4]]
    stops = _stops_that_fire(model, tokenizer, free)
    pad = tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                               eos_token_id=stops, pad_token_id=pad)[:, width:].tolist()
    for batch_size in (None, 5):
        ours = sample_responses(model, prompts, SamplingParams(
            max_new_tokens=16, stop_ids=stops, pad_id=pad, greedy=True, batch_size=batch_size))
        for response, row in zip(ours.response_ids, generated, strict=True):
            assert response == row[:len(response)]
            assert response[-1] in stops or len(response) == 16
        assert len({len(r) for r in ours.response_ids}) > 2


def test_stops_keep_order_and_are_reproducible(tiny) -> None:
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6) * 4
    stops = stop_token_ids(tokenizer, model)
    sampling = SamplingParams(max_new_tokens=12, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                              temperature=1.5)
    a = sample_responses(model, prompts, sampling, generator=torch.Generator().manual_seed(5))
    b = sample_responses(model, prompts, sampling, generator=torch.Generator().manual_seed(5))
    assert a.response_ids == b.response_ids
    for response, finished in zip(a.response_ids, a.finished, strict=True):
        assert 1 <= len(response) <= 12
        assert not any(t in stops for t in response[:-1])
        assert finished == (response[-1] in stops)
    chunked = sample_responses(model, prompts, replace(sampling, batch_size=7),
                               generator=torch.Generator().manual_seed(5))
    assert len(chunked.response_ids) == len(prompts)


def _last_logits(model, prompts: list[list[int]], pad_id: int) -> torch.Tensor:
    """``[B, V]`` next-token logits of every prompt, one left-padded forward, every row its own."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask,
                     position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]


def test_shared_prefill_samples_from_each_rows_own_distribution(tiny) -> None:
    """Repeated prompts are prefilled once: the first tokens are the draws ``sample_next_token``
    makes, with the same generator, from every row's logits computed on its own."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 3)
    batch = [p for p in prompts for _ in range(5)]
    pad = tokenizer.pad_token_id
    ours = sample_responses(model, batch, SamplingParams(max_new_tokens=1, stop_ids=[258],
                                                         pad_id=pad, temperature=1.3, top_p=0.9),
                            generator=torch.Generator().manual_seed(2))
    expected = sample_next_token(_last_logits(model, batch, pad), temperature=1.3, top_p=0.9,
                                 generator=torch.Generator().manual_seed(2))
    assert [r[0] for r in ours.response_ids] == expected.tolist()
    assert len(set(expected.tolist())) > 3  # the draws differ between copies


def test_stop_token_ids_of_tiny_tokenizer(tiny) -> None:
    _, tokenizer = tiny
    vocab = tokenizer.get_vocab()
    assert vocab["<|im_end|>"] in stop_token_ids(tokenizer)


# --- continuations of one sequence's prefixes -----------------------------------------------
@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_arch(request):
    model = tiny_random_model(request.param, seed=4, initializer_range=0.3).eval()
    return model, build_tiny_tokenizer()


def _sequence(tokenizer) -> list[int]:
    return tokenizer("what is 3 + 4? the answer is seven", add_special_tokens=False)["input_ids"]


def test_greedy_continuations_equal_generate_from_each_prefix(tiny_arch) -> None:
    """Every cut's greedy continuation, decoded from the one cache of the whole sequence with
    rows of several cuts in one left-padded batch, equals ``model.generate(do_sample=False)``
    and ``sample_responses(greedy=True)`` from that prefix alone."""
    model, tokenizer = tiny_arch
    sequence = _sequence(tokenizer)
    stops = stop_token_ids(tokenizer, model)
    pad = tokenizer.pad_token_id
    cuts = [len(sequence), 1, 7, 3, 7, len(sequence) - 1]
    expected = {c: _cut(_generate_greedy(model, sequence[:c], 12, pad), stops) for c in cuts}
    for batch_size in (None, 5):  # 5: batches of rows of two or three cuts
        greedy = SamplingParams(max_new_tokens=12, stop_ids=stops, pad_id=pad, greedy=True)
        result = sample_continuations(model, sequence, cuts, 2,
                                      replace(greedy, batch_size=batch_size))
        assert len(result) == len(cuts)
        for cut, drawn in zip(cuts, result, strict=True):
            prefix = sequence[:cut]
            assert drawn.prompt_ids == [prefix, prefix]
            assert [(r, f) for r, f in zip(drawn.response_ids, drawn.finished,
                                           strict=True)] == [expected[cut]] * 2
            alone = sample_responses(model, [prefix], greedy)
            assert alone.response_ids[0] == expected[cut][0]


def test_sampled_continuations_follow_sample_responses(tiny_arch) -> None:
    """One cut's continuations consume the generator as ``sample_responses`` does on
    ``samples`` copies of that prefix (same draws), and a fixed generator repeats them; several
    cuts in chunks are reproducible and keep the stopping rules."""
    model, tokenizer = tiny_arch
    sequence = _sequence(tokenizer)
    stops = stop_token_ids(tokenizer, model)
    sampling = SamplingParams(max_new_tokens=10, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                              temperature=1.4, top_p=0.95)
    for cut in (4, len(sequence)):
        (one,) = sample_continuations(model, sequence, [cut], 6, sampling,
                                      generator=torch.Generator().manual_seed(7))
        copies = sample_responses(model, [sequence[:cut]] * 6, sampling,
                                  generator=torch.Generator().manual_seed(7))
        assert one.response_ids == copies.response_ids
        assert one.finished == copies.finished
        assert len({tuple(r) for r in one.response_ids}) > 1
    cuts = [2, 9, 5, len(sequence)]
    runs = [sample_continuations(model, sequence, cuts, 3, replace(sampling, batch_size=4),
                                 generator=torch.Generator().manual_seed(8))
            for _ in range(2)]
    assert [r.response_ids for r in runs[0]] == [r.response_ids for r in runs[1]]
    for drawn in runs[0]:
        assert len(drawn.response_ids) == 3
        for response, finished in zip(drawn.response_ids, drawn.finished, strict=True):
            assert 1 <= len(response) <= 10
            assert not any(t in stops for t in response[:-1])
            assert finished == (response[-1] in stops)


def test_continuations_first_tokens_are_draws_from_each_prefix(tiny) -> None:
    """The first token of every continuation row is the draw ``sample_next_token`` makes from
    the logits of its prefix computed alone."""
    model, tokenizer = tiny
    sequence = _sequence(tokenizer)
    cuts = [3, 1, len(sequence), 8]
    result = sample_continuations(model, sequence, cuts, 4,
                                  SamplingParams(max_new_tokens=1, stop_ids=[258],
                                                 pad_id=tokenizer.pad_token_id, temperature=0.8),
                                  generator=torch.Generator().manual_seed(3))
    prefixes = [sequence[:c] for c in cuts for _ in range(4)]
    expected = sample_next_token(_last_logits(model, prefixes, tokenizer.pad_token_id),
                                 temperature=0.8, generator=torch.Generator().manual_seed(3))
    assert [r[0] for drawn in result for r in drawn.response_ids] == expected.tolist()


def test_continuation_arguments_are_checked(tiny) -> None:
    model, tokenizer = tiny
    sampling = SamplingParams(max_new_tokens=4, stop_ids=[258], pad_id=tokenizer.pad_token_id)
    with pytest.raises(ValueError, match=r"cuts must be in \[1, 3\]"):
        sample_continuations(model, [5, 6, 7], [0, 2], 2, sampling)
    with pytest.raises(ValueError, match=r"cuts must be in \[1, 3\]"):
        sample_continuations(model, [5, 6, 7], [4], 2, sampling)
    with pytest.raises(ValueError, match="samples"):
        sample_continuations(model, [5, 6, 7], [2], 0, sampling)


def test_paired_continuations_do_not_depend_on_the_other_cuts(tiny) -> None:
    """With paired draws every continuation row samples with its own pre-drawn numbers, so a
    cut's continuations are the same whether other cuts decode beside it or not (fp32), as
    :func:`sample_responses` does for its rows."""
    model, tokenizer = tiny
    sequence = _sequence(tokenizer)
    stops = sorted(set(stop_token_ids(tokenizer, model)) | {sequence[4]})
    sampling = SamplingParams(max_new_tokens=8, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                              temperature=1.5, paired_draws=True)
    alone = sample_continuations(model, sequence, [5], 3, sampling,
                                 generator=torch.Generator().manual_seed(9))
    beside = sample_continuations(model, sequence, [5, 2, len(sequence)], 3, sampling,
                                  generator=torch.Generator().manual_seed(9))
    assert beside[0].response_ids == alone[0].response_ids
    assert beside[0].finished == alone[0].finished
    assert len({tuple(r) for r in alone[0].response_ids}) > 1


def test_continuations_of_several_sequences_equal_each_sequence_alone(tiny_arch) -> None:
    """Cuts of two sequences decoding in shared batches (chunks of 5 rows spanning both, each
    row's cache read from its own sequence) give every cut the greedy continuation its
    sequence alone gives, each capped at its own budget."""
    model, tokenizer = tiny_arch
    first = _sequence(tokenizer)
    second = tokenizer("a dog sat on the mat", add_special_tokens=False)["input_ids"]
    stops = stop_token_ids(tokenizer, model)
    greedy = SamplingParams(max_new_tokens=12, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                            greedy=True)
    cuts = [(1, 3), (0, 7), (1, len(second)), (0, 2), (1, 3)]
    budgets = [12, 5, 12, 2, 4]
    together = continue_sequences(model, [first, second], cuts, 2,
                                  replace(greedy, batch_size=5), budgets=budgets)
    for (s, c), budget, drawn in zip(cuts, budgets, together, strict=True):
        (alone,) = sample_continuations(model, [first, second][s], [c], 1, greedy)
        expected = alone.response_ids[0][:budget]
        assert drawn.prompt_ids == [[first, second][s][:c]] * 2
        assert drawn.response_ids == [expected] * 2
        assert drawn.finished == [expected[-1] in stops] * 2
    with pytest.raises(ValueError, match="name sequences"):
        continue_sequences(model, [first], [(1, 2)], 1, greedy)
    with pytest.raises(ValueError, match="budgets"):
        continue_sequences(model, [first], [(0, 2)], 1, greedy, budgets=[13])


def test_the_sampler_imports_nothing_of_the_trainer() -> None:
    """``gear_rl.sampling`` sits below ``gear_rl.train``: importing it loads no trainer module."""
    import subprocess
    import sys

    code = ("import sys, gear_rl.sampling; "
            "print([m for m in sys.modules if m.startswith('gear_rl.train')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"

def test_sampling_params_are_checked_and_stop_ids_normalised() -> None:
    """A :class:`SamplingParams` refuses what the sampler cannot do (a zero cap, a
    non-positive temperature unless greedy, a top-p outside (0, 1], an empty decoding batch)
    and keeps its stop ids as a sorted tuple without repeats."""
    base = {"stop_ids": [258], "pad_id": 256}
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0, **base)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(max_new_tokens=4, temperature=0.0, **base)
    assert SamplingParams(max_new_tokens=4, temperature=0.0, greedy=True, **base).greedy
    for top_p in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            SamplingParams(max_new_tokens=4, top_p=top_p, **base)
    with pytest.raises(ValueError, match="batch_size"):
        SamplingParams(max_new_tokens=4, batch_size=0, **base)
    assert SamplingParams(max_new_tokens=4, stop_ids=[7, 3, 7], pad_id=0).stop_ids == (3, 7)


def test_paired_draws_fix_each_rows_numbers_and_still_stop_early(tiny) -> None:
    """paired_draws: row i samples step s with its own pre-drawn number, so (a) its response
    with stop tokens is its no-stop response cut at the first stop (rows leave the decoding
    batch as they finish, the numbers do not shift), (b) other rows' prompts do not change it,
    (c) chunking by batch_size does not either (the numbers are drawn row after row)."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6) * 3
    free_stops: list[int] = []  # no row stops
    def run(rows, stops, batch_size=None):
        sampling = SamplingParams(max_new_tokens=12, stop_ids=stops,
                                  pad_id=tokenizer.pad_token_id, temperature=1.5,
                                  batch_size=batch_size, paired_draws=True)
        return sample_responses(model, rows, sampling, generator=torch.Generator().manual_seed(3))

    free = run(prompts, free_stops).response_ids
    assert all(len(r) == 12 for r in free)
    stops = sorted(set(stop_token_ids(tokenizer, model)) | {free[0][3], free[4][7]})
    sizes: list[int] = []
    hook = model.register_forward_hook(lambda _m, args, kwargs, _o: sizes.append(
        kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        stopped = run(prompts, stops)
    finally:
        hook.remove()
    expected = [_cut(r, stops) for r in free]
    assert [(r, f) for r, f in zip(stopped.response_ids, stopped.finished, strict=True)] == \
        expected
    assert sum(f for _, f in expected) >= 2 and sizes[-1] < len(prompts)  # rows left early
    other = run([*prompts[:-1], prompts[1]], stops).response_ids
    assert other[:-1] == stopped.response_ids[:-1]
    assert run(prompts, stops, batch_size=7).response_ids == stopped.response_ids


def test_row_budgets_and_row_stop_end_each_row_where_they_say(tiny) -> None:
    """``budgets`` ends row i after its own cap; ``row_stop`` ends a row at the first step
    whose token is a trigger and whose tokens so far satisfy ``done`` (asked only then). With
    paired draws every row keeps its numbers, so each response is its free response cut
    there, and neither is a finished (stop-token) response."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 6) * 2
    sampling = SamplingParams(max_new_tokens=12, stop_ids=[], pad_id=tokenizer.pad_token_id,
                              temperature=1.5, paired_draws=True)

    def run(**extra):
        return sample_responses(model, prompts, sampling,
                                generator=torch.Generator().manual_seed(4), **extra)

    free = run().response_ids
    budgets = [1 + (5 * i) % 12 for i in range(len(prompts))]
    capped = run(budgets=budgets)
    assert capped.response_ids == [r[:b] for r, b in zip(free, budgets, strict=True)]
    assert not any(capped.finished)
    with pytest.raises(ValueError, match="budgets"):
        run(budgets=[13] * len(prompts))
    with pytest.raises(ValueError, match="budgets"):
        run(budgets=[3])

    triggers = {free[0][3], free[5][8], free[7][1]}
    table = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    table[sorted(triggers)] = True
    asked: list[list[int]] = []

    def done(ids: list[int]) -> bool:
        asked.append(list(ids))
        return len(ids) >= 3

    stopped = run(row_stop=RowStop(trigger=table, done=done))
    expected = []
    for row in free:
        cut = next((t for t, token in enumerate(row) if token in triggers and t >= 2), None)
        expected.append(row if cut is None else row[:cut + 1])
    assert stopped.response_ids == expected
    assert sum(len(e) < 12 for e in expected) >= 2 and not any(stopped.finished)
    assert asked and all(ids[-1] in triggers for ids in asked)  # asked at trigger tokens only


def test_a_turn_stopped_at_its_call_is_cut_as_the_loop_cuts_it() -> None:
    """The agent sampler's stop (``gear_rl.train.episodes.call_stop``: the row's new tokens
    hold a complete call, asked after tokens with the closing tag's last character) never
    changes the turn the loop keeps: for random turns, with or without the first part of a
    resumed turn before them, cutting the new tokens where the sampler stops and then as the
    loop does gives the loop's cut of the whole turn."""
    import random

    from gear_rl.agent import get_format
    from gear_rl.agent.loop import _cut_turn
    from gear_rl.train.episodes import call_stop

    tokenizer = build_tiny_tokenizer()
    draw = random.Random(0)
    for name, pieces in (("python", ["<python>", "</python>", "print(1)", "x", ">", " ", "<"]),
                         ("markdown", ["```python", "\n```", "\n", "`", "print(2)", "``", " "]),
                         ("json", ["<tool_call>", "</tool_call>", '{"name": "f"}', ">", "a"])):
        fmt = get_format(name)
        stop = call_stop(tokenizer, name)
        vocab = [tokenizer.encode(p, add_special_tokens=False) for p in pieces]
        stopped_early = 0
        for _ in range(300):
            partial = [t for _ in range(draw.randint(0, 3)) for t in draw.choice(vocab)]
            new = [t for _ in range(draw.randint(1, 12)) for t in draw.choice(vocab)]
            end = next((t + 1 for t, token in enumerate(new)
                        if bool(stop.trigger[token]) and stop.done(new[:t + 1])), len(new))
            stopped_early += end < len(new)
            assert _cut_turn(partial + new[:end], tokenizer, set(), fmt) == \
                _cut_turn(partial + new, tokenizer, set(), fmt), (name, partial, new)
        assert stopped_early > 20, name


def _turn_contexts(contexts, responses, turn: int, tokenizer) -> list[list[int]]:
    """The next turn's contexts: each row's context, response and an observation of its own
    length; row 2 at turn 1 drops its response's last token (a loop that trims a turn), and
    row 1 at turn 2 takes row 0's context (two rows of one decoding chunk extending one kept
    row)."""
    out = []
    for row, (context, response) in enumerate(zip(contexts, responses, strict=True)):
        kept = response[:-1] if (row, turn) == (2, 1) else response
        out.append(context + kept + tokenizer.encode(f" obs{turn}:{row}" * (row % 3 + 1)))
    if turn == 2:
        out[1] = list(out[0])
    return out


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_turn_cache_samples_what_prefilling_every_turn_samples(arch: str, greedy: bool) -> None:
    """Four turns of multi-turn sampling with a ``TurnCache``: a context is prefilled only past
    the kept row it extends (the hit and reused-position counts say which), and every turn
    draws what prefilling each context whole draws (fp32, same generator seed): with repeated
    contexts, row budgets, decoding chunks, a row whose context extends no kept row, and two
    rows extending the same one."""
    model = tiny_random_model(arch, seed=3, initializer_range=0.3)
    tokenizer = build_tiny_tokenizer()
    first = _prompts(tokenizer, 3)
    contexts = [first[i] for i in (0, 0, 0, 1, 1, 2)]
    stops = stop_token_ids(tokenizer)
    cache = TurnCache()
    hits = reused = 0
    previous: dict[tuple[int, ...], int] = {}
    sampling = SamplingParams(max_new_tokens=12, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                              greedy=greedy, batch_size=4)
    for turn in range(4):
        ours, full = (sample_responses(model, contexts, sampling,
                                       generator=torch.Generator().manual_seed(turn),
                                       budgets=[12, 5, 12, 9, 12, 12], turn_cache=turn_cache)
                      for turn_cache in (cache, None))
        cache.advance()
        assert ours.response_ids == full.response_ids and ours.finished == full.finished
        for context in contexts:  # the longest kept row each context extends
            found = [length for key, length in previous.items()
                     if tuple(context[:len(key)]) == key]
            hits, reused = hits + bool(found), reused + max(found, default=0)
        assert (cache.hits, cache.reused_tokens) == (hits, reused)
        previous = {tuple(c + r): len(c) + len(r) - 1
                    for c, r in zip(contexts, ours.response_ids, strict=True)}
        contexts = _turn_contexts(contexts, ours.response_ids, turn, tokenizer)
    assert hits == 17  # 6 rows in each of 3 later turns, less the trimmed one
    cache.clear()
    assert cache.lookup(contexts[0]) is None



def test_turn_cache_keeps_at_most_max_rows() -> None:
    """With ``max_rows`` the cache never holds more rows than that (checked as every row
    leaves the batch); rows that did not fit prefill their next context whole, and the draws
    stay those of prefilling every turn."""
    model = tiny_random_model("llama", seed=3, initializer_range=0.3)
    tokenizer = build_tiny_tokenizer()
    contexts = _prompts(tokenizer, 6)
    stops = stop_token_ids(tokenizer)
    cache, most = TurnCache(max_rows=3), 0
    original_add = cache.add

    def add(sequence, layers) -> None:
        nonlocal most
        original_add(sequence, layers)
        most = max(most, cache.kept_rows)

    cache.add = add  # type: ignore[method-assign]
    sampling = SamplingParams(max_new_tokens=8, stop_ids=stops, pad_id=tokenizer.pad_token_id,
                              batch_size=2)
    for turn in range(3):
        ours, full = (sample_responses(model, contexts, sampling,
                                       generator=torch.Generator().manual_seed(turn),
                                       turn_cache=turn_cache)
                      for turn_cache in (cache, None))
        cache.advance()
        assert ours.response_ids == full.response_ids
        contexts = _turn_contexts(contexts, ours.response_ids, turn, tokenizer)
    assert most == 3
    assert 0 < cache.hits < 12  # some of the 6 rows in each of 2 later turns, not all
    with pytest.raises(ValueError, match="max_rows"):
        TurnCache(max_rows=0)

def test_turn_cache_is_unused_with_sliding_window_layers() -> None:
    """A model with a sliding-window layer keeps its own cache layers: the turn cache is left
    alone (no hits, nothing kept) and the draws are those without it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         use_sliding_window=True, sliding_window=6, max_window_layers=1,
                         initializer_range=0.3, eos_token_id=258, pad_token_id=256)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).eval()
    tokenizer = build_tiny_tokenizer()
    contexts, cache = _prompts(tokenizer, 3), TurnCache()
    sampling = SamplingParams(max_new_tokens=8, stop_ids=[258], pad_id=256, greedy=True)
    for turn in range(2):
        ours, full = (sample_responses(model, contexts, sampling, turn_cache=turn_cache)
                      for turn_cache in (cache, None))
        cache.advance()
        assert ours.response_ids == full.response_ids
        contexts = _turn_contexts(contexts, ours.response_ids, turn, tokenizer)
    assert cache.hits == 0 and cache.lookup(contexts[0]) is None
