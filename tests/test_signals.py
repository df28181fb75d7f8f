"""token_signals against a naive computation: separate unpadded forwards per example, the full
[L, V] logits, log-softmax in float64, indexing by hand."""

from __future__ import annotations

import copy

import pytest
import torch

from gear_rl.models import tiny_random_model
from gear_rl.signals import (
    DIVERGENCE_KINDS,
    TokenSignals,
    backbone_tokens,
    default_chunk_size,
    response_logprobs,
    token_signals,
)
from gear_rl.signals.divergence import (
    MAX_LOG_RATIO,
    PROMPT_LENGTH_SLACK,
    sampled_token_divergence,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# Within 1e-5, absolutely or relatively: k3 = r - 1 - log r grows like exp(log-prob gap), and
# float32 log-probs (about 1e-6 off the float64 reference) put a large k3 off by ~1e-6 of itself.
ATOL = RTOL = 1e-5

# A ragged batch: prompt, teacher prompt and response lengths all differ, one prompt is a single
# token, one response is a single token, one response has an observation span (mask 0) inside.
PROMPT_LENGTHS = (3, 11, 1, 7)
TEACHER_LENGTHS = (9, 4, 2, 15)
RESPONSE_LENGTHS = (6, 13, 1, 9)
OBSERVATION = (1, slice(3, 7))  # example 1, response positions 3..6


def _batch(vocab: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    prompts = [ids(n) for n in PROMPT_LENGTHS]
    # Teacher prompts share a prefix with the student's, like a real hint would.
    teachers = [(p + ids(n))[:n] if n > len(p) else ids(n)
                for p, n in zip(prompts, TEACHER_LENGTHS, strict=True)]
    responses = [ids(n) for n in RESPONSE_LENGTHS]
    mask = [[1] * n for n in RESPONSE_LENGTHS]
    b, span = OBSERVATION
    for t in range(span.start, span.stop):
        mask[b][t] = 0
    return prompts, teachers, responses, mask


def naive_signals(model, prompts, teachers, responses, mask, *, temperature=1.0, topk=5,
                  grad=False):
    """The obvious computation, one example at a time, in float64 after the LM head.

    Returns ``[B, T]`` float64 tensors: student, teacher, entropy, and one divergence per
    estimator (``full``, ``topk`` over the student's ``topk`` most likely tokens, ``k1``, ``k3``).
    """
    names = ("student", "teacher", "entropy", *DIVERGENCE_KINDS)
    batch, length = len(responses), max(len(r) for r in responses)
    zero = torch.zeros((), dtype=torch.float64)
    rows = {name: [[zero] * length for _ in range(batch)] for name in names}
    for b in range(batch):
        with torch.set_grad_enabled(grad):
            student_logits = model(torch.tensor([prompts[b] + responses[b]])).logits[0]
        with torch.no_grad():
            teacher_logits = model(torch.tensor([teachers[b] + responses[b]])).logits[0]
        student = torch.log_softmax(student_logits.double() / temperature, -1)
        teacher = torch.log_softmax(teacher_logits.double() / temperature, -1)
        for t, token in enumerate(responses[b]):
            if not mask[b][t]:
                continue
            s = student[len(prompts[b]) + t - 1]  # the distribution that predicted token t
            q = teacher[len(teachers[b]) + t - 1]
            rows["student"][b][t] = s[token]
            rows["teacher"][b][t] = q[token]
            rows["entropy"][b][t] = -(s.exp() * s).sum()
            rows["full"][b][t] = (s.exp() * (s - q)).sum()
            index = torch.topk(s, topk).indices
            s_top = s[index] - s[index].logsumexp(0)
            q_top = q[index] - q[index].logsumexp(0)
            rows["topk"][b][t] = (s_top.exp() * (s_top - q_top)).sum()
            rows["k1"][b][t] = s[token] - q[token]
            log_ratio = q[token] - s[token]
            rows["k3"][b][t] = log_ratio.exp() - 1 - log_ratio
    return {name: torch.stack([torch.stack(row) for row in value])
            for name, value in rows.items()}


def _model(arch: str, **kwargs):
    # initializer_range 0.3: peaked, far-from-uniform distributions, so that an off-by-one
    # position or a wrong normalisation shows up far above the tolerance.
    defaults = dict(vocab_size=301, initializer_range=0.3, seed=1)
    return tiny_random_model(arch, **{**defaults, **kwargs})


def _assert_matches(sig: TokenSignals, ref: dict, mask: list[list[int]], estimator: str):
    expected_mask = torch.zeros_like(sig.mask)
    for b, row in enumerate(mask):
        expected_mask[b, : len(row)] = torch.tensor(row, dtype=torch.float32)
    assert torch.equal(sig.mask, expected_mask)
    for field, name in [("student_logprobs", "student"), ("teacher_logprobs", "teacher"),
                        ("entropy", "entropy"), ("divergence", estimator)]:
        got = getattr(sig, field)
        assert got.dtype == torch.float32 and got.shape == sig.mask.shape, field
        torch.testing.assert_close(got.double(), ref[name].detach(), atol=ATOL, rtol=RTOL,
                                   msg=lambda m, f=field: f"{f}: {m}")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_matches_naive_forwards(arch):
    model = _model(arch)
    prompts, teachers, responses, mask = _batch(301)
    ref = naive_signals(model, prompts, teachers, responses, mask, temperature=0.7, topk=17)
    for estimator in DIVERGENCE_KINDS:
        sig = token_signals(model, prompts, teachers, responses, temperature=0.7,
                            estimator=estimator, topk=17 if estimator == "topk" else None,
                            response_mask=mask, chunk_size=5)
        _assert_matches(sig, ref, mask, estimator)
        # The check has teeth: the signals are far from trivial.
        assert sig.divergence.abs().max() > 0.05, estimator
        assert sig.entropy.max() > 0.1


def test_tied_embeddings_default_chunk_and_tensor_mask():
    model = _model("llama", tie_word_embeddings=True)
    prompts, teachers, responses, mask = _batch(301, seed=3)
    length = max(RESPONSE_LENGTHS)
    tensor_mask = torch.zeros(len(mask), length, dtype=torch.long)
    for b, row in enumerate(mask):
        tensor_mask[b, : len(row)] = torch.tensor(row)
    tensor_mask[0, -1] = 1  # past response 0's end: ignored
    sig = token_signals(model, prompts, teachers, responses, response_mask=tensor_mask)
    ref = naive_signals(model, prompts, teachers, responses, mask)
    _assert_matches(sig, ref, mask, "full")


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 10_000])
def test_chunk_size_does_not_change_results(chunk_size):
    model = _model("qwen3")
    prompts, teachers, responses, mask = _batch(301, seed=5)
    base = token_signals(model, prompts, teachers, responses, response_mask=mask)
    sig = token_signals(model, prompts, teachers, responses, response_mask=mask,
                        chunk_size=chunk_size)
    for field in ("student_logprobs", "teacher_logprobs", "entropy", "divergence", "mask"):
        torch.testing.assert_close(getattr(sig, field), getattr(base, field), atol=1e-5, rtol=0)


@pytest.mark.parametrize("share_prompts", [False, True])
def test_observation_tokens_stay_in_context(share_prompts):
    """An observation token is zero in the output but still conditions the tokens after it."""
    model = _model("llama")
    batch, (b, span), lengths = ((_batch, OBSERVATION, RESPONSE_LENGTHS) if not share_prompts
                                 else (_shared_batch, SHARED_OBSERVATION,
                                       SHARED_RESPONSE_LENGTHS))
    prompts, teachers, responses, mask = batch(301, seed=7)
    changed = [list(r) for r in responses]
    changed[b][span.start] = (changed[b][span.start] + 1) % 301
    one = token_signals(model, prompts, teachers, responses, response_mask=mask,
                        share_prompts=share_prompts)
    two = token_signals(model, prompts, teachers, changed, response_mask=mask,
                        share_prompts=share_prompts)
    assert torch.all(one.student_logprobs[b, span] == 0)
    assert torch.all(one.divergence[b, span] == 0)
    after = slice(span.stop, lengths[b])
    assert not torch.allclose(one.student_logprobs[b, after], two.student_logprobs[b, after])
    others = [i for i in range(len(responses)) if i != b]
    torch.testing.assert_close(one.student_logprobs[others], two.student_logprobs[others],
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(4))
def test_k3_nonnegative_and_full_kl_zero_for_identical_prompts(seed):
    model = _model("qwen3", initializer_range=1.0, seed=seed)
    prompts, teachers, responses, _mask = _batch(301, seed=seed)
    k3 = token_signals(model, prompts, teachers, responses, estimator="k3", temperature=0.3)
    assert torch.all(k3.divergence >= 0)
    assert k3.divergence.max() > 0
    for estimator, topk in [("full", None), ("topk", 5), ("k1", None), ("k3", None)]:
        same = token_signals(model, prompts, prompts, responses, estimator=estimator, topk=topk)
        torch.testing.assert_close(same.divergence, torch.zeros_like(same.divergence),
                                   atol=1e-6, rtol=0)
        torch.testing.assert_close(same.student_logprobs, same.teacher_logprobs,
                                   atol=1e-6, rtol=0)


def test_topk_with_whole_vocabulary_equals_full():
    model = _model("llama")
    prompts, teachers, responses, _mask = _batch(301, seed=11)
    full = token_signals(model, prompts, teachers, responses, estimator="full")
    topk = token_signals(model, prompts, teachers, responses, estimator="topk", topk=301)
    torch.testing.assert_close(topk.divergence, full.divergence, atol=1e-5, rtol=0)


@pytest.mark.parametrize("share_prompts", [None, True])
def test_student_gradients_match_naive(share_prompts):
    """The default full pass, and the shared-prompt pass (the cached prompt states are part of
    the graph), both give the naive forwards' gradients."""
    torch.manual_seed(0)
    model = _model("qwen2", num_layers=1)
    batch = _batch if share_prompts is None else _shared_batch
    prompts, teachers, responses, mask = batch(301, seed=13)
    sig = token_signals(model, prompts, teachers, responses, response_mask=mask, chunk_size=4,
                        student_requires_grad=True, share_prompts=share_prompts)
    assert sig.student_logprobs.requires_grad and sig.divergence.requires_grad
    assert not sig.teacher_logprobs.requires_grad
    weights = torch.rand(sig.mask.shape)  # a generic loss, so every field's gradient counts
    loss = ((sig.student_logprobs + 0.5 * sig.entropy + 2 * sig.divergence) * weights).sum()
    grads = torch.autograd.grad(loss, list(model.parameters()))

    ref = naive_signals(model, prompts, teachers, responses, mask, grad=True)
    ref_loss = ((ref["student"] + 0.5 * ref["entropy"] + 2 * ref["full"])
                * weights.double()).sum()
    ref_grads = torch.autograd.grad(ref_loss, list(model.parameters()))
    for (name, _), got, want in zip(model.named_parameters(), grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want.float(), atol=2e-5, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert any(g.abs().max() > 1e-3 for g in grads)


@pytest.mark.parametrize("estimator", ["full", "k3"])
def test_divergence_without_gradients_skips_the_teachers_recomputation(estimator):
    """divergence_requires_grad=False: the same values, the same student gradients, no graph
    through the divergence, and the backward's checkpoint recomputation stops before the
    teacher's LM head (one head call per chunk in the backward instead of two)."""
    torch.manual_seed(0)
    model = _model("qwen2", num_layers=1)
    prompts, teachers, responses, mask = _shared_batch(301, seed=13)
    calls = {"n": 0}
    model.lm_head.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    results = {}
    for flag in (True, False):
        sig = token_signals(model, prompts, teachers, responses, response_mask=mask,
                            chunk_size=4, student_requires_grad=True, estimator=estimator,
                            divergence_requires_grad=flag)
        assert sig.divergence.requires_grad is flag and sig.student_logprobs.requires_grad
        weights = torch.rand(sig.mask.shape, generator=torch.Generator().manual_seed(1))
        loss = ((sig.student_logprobs + 0.5 * sig.entropy) * weights).sum()
        calls["n"] = 0
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results[flag] = (sig, grads, calls["n"])
    (on, on_grads, on_calls), (off, off_grads, off_calls) = results[True], results[False]
    chunks = -(-int(on.mask.sum()) // 4)
    assert (on_calls, off_calls) == (2 * chunks, chunks)
    for name in ("student_logprobs", "teacher_logprobs", "entropy", "divergence"):
        assert torch.equal(getattr(on, name).detach(), getattr(off, name)), name
    for got, want in zip(off_grads, on_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-6)


def test_response_logprobs_is_each_side_alone():
    model = _model("qwen3")
    prompts, teachers, responses, mask = _batch(301, seed=19)
    ref = naive_signals(model, prompts, teachers, responses, mask, temperature=1.3)
    student = response_logprobs(model, prompts, responses, temperature=1.3, response_mask=mask,
                                chunk_size=6)
    teacher = response_logprobs(model, teachers, responses, temperature=1.3, response_mask=mask)
    torch.testing.assert_close(student.logprobs.double(), ref["student"], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(student.entropy.double(), ref["entropy"], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(teacher.logprobs.double(), ref["teacher"], atol=ATOL, rtol=RTOL)
    assert torch.equal(student.mask, teacher.mask)
    assert not student.logprobs.requires_grad
    grad = response_logprobs(model, prompts, responses, response_mask=mask, requires_grad=True)
    assert grad.logprobs.requires_grad and grad.entropy.requires_grad
    with pytest.raises(ValueError, match="response_ids has 3 entries but prompt_ids has 4"):
        response_logprobs(model, prompts, responses[:3])


def test_fully_masked_rows_are_zero():
    model = _model("llama")
    prompts, teachers, responses, _mask = _batch(301)
    nothing = [[0] * len(r) for r in responses]
    sig = token_signals(model, prompts, teachers, responses, response_mask=nothing,
                        student_requires_grad=True)
    assert sig.mask.sum() == 0 and torch.all(sig.divergence == 0)
    assert sig.student_logprobs.shape == (4, max(RESPONSE_LENGTHS))


def test_no_grad_by_default():
    model = _model("llama")
    prompts, teachers, responses, _mask = _batch(301)
    sig = token_signals(model, prompts, teachers, responses)
    assert not any(getattr(sig, f).requires_grad
                   for f in ("student_logprobs", "entropy", "divergence"))


def test_bfloat16_model_close_to_float32():
    prompts, teachers, responses, mask = _batch(301, seed=17)
    fp32 = token_signals(_model("qwen3"), prompts, teachers, responses, response_mask=mask)
    bf16 = token_signals(_model("qwen3", dtype=torch.bfloat16), prompts, teachers, responses,
                         response_mask=mask)
    for field in ("student_logprobs", "teacher_logprobs", "entropy", "divergence"):
        value = getattr(bf16, field)
        assert value.dtype == torch.float32 and torch.isfinite(value).all()
        # bf16 weights and activations: about 3 significant digits, so a loose tolerance.
        torch.testing.assert_close(value, getattr(fp32, field), atol=0.15, rtol=0.05)


@pytest.mark.parametrize("estimator", ["full", "k3"])
def test_chunk_signals_stay_float32_under_autocast(estimator: str):
    """The trainer runs the signals under bf16 autocast: the LM head's logits are bf16, but the
    entropy and the divergence are reduced in fp32 from fp32 log-softmaxes. (``einsum`` lowers
    to ``bmm``, which autocast runs in bf16: that rounded every probability and log-prob to 8
    bits and returned bf16, about 1e-2 off at these entropies.)"""
    from gear_rl.signals.divergence import _chunk_scores, _chunk_signals

    generator = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(64, 4096, bias=False)
    student_hidden, teacher_hidden = torch.randn(2, 37, 64, generator=generator)
    targets = torch.randint(0, 4096, (37,), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        student_logits, teacher_logits = head(student_hidden), head(teacher_hidden)
        signals = _chunk_signals(head, student_hidden, teacher_hidden, targets, 0.7, estimator,
                                 None)
        scores = _chunk_scores(head, student_hidden, targets, 0.7)
    student = (student_logits.double() / 0.7).log_softmax(-1)
    teacher = (teacher_logits.double() / 0.7).log_softmax(-1)
    entropy = -(student.exp() * student).sum(-1)
    expected_divergence = ((student.exp() * (student - teacher)).sum(-1) if estimator == "full"
                           else sampled_token_divergence(student.gather(-1, targets[:, None])[:, 0],
                                                         teacher.gather(-1, targets[:, None])[:, 0],
                                                         "k3"))
    for value, expected in ((signals[2], entropy), (scores[1], entropy),
                            (signals[3], expected_divergence)):
        assert value.dtype == torch.float32
        torch.testing.assert_close(value.double(), expected, atol=ATOL, rtol=RTOL)


def test_default_chunk_size():
    assert default_chunk_size(49_152) == 682
    assert default_chunk_size(151_936) == 220
    assert default_chunk_size(301) == 4096
    assert default_chunk_size(10**9) == 16
    assert default_chunk_size(49_152, half_precision=True) == 170
    assert default_chunk_size(151_936, half_precision=True) == 55
    assert default_chunk_size(10**9, half_precision=True) == 16


def test_default_chunk_size_follows_the_heads_precision():
    from gear_rl.signals.divergence import _check_chunk_size

    head = torch.nn.Linear(8, 49_152, bias=False)
    assert _check_chunk_size(None, head) == 682
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _check_chunk_size(None, head) == 170
        assert _check_chunk_size(64, head) == 64
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert _check_chunk_size(None, head) == 682
    assert _check_chunk_size(None, head.to(torch.bfloat16)) == 170


# --- bad input ----------------------------------------------------------------------------------


def _bad_calls():
    p, t, r = [[1, 2], [3]], [[4], [5, 6]], [[7, 8], [9]]
    return [
        (dict(teacher_prompt_ids=[[1]]), "teacher_prompt_ids has 1 entries"),
        (dict(response_ids=[[1], [2], [3]]), "response_ids has 3 entries"),
        (dict(prompt_ids=[], teacher_prompt_ids=[], response_ids=[]), "prompt_ids is empty"),
        (dict(response_ids=[[7, 8], []]), r"response_ids\[1\] is empty"),
        (dict(prompt_ids=[[], [3]]), r"prompt_ids\[0\] is empty"),
        (dict(prompt_ids="abc"), "prompt_ids must be a list"),
        (dict(response_ids=[[7, 8.5], [9]]), r"response_ids\[0\] must contain ints"),
        (dict(response_ids=[[7, 301], [9]]), r"response_ids\[0\] has token ids outside"),
        (dict(teacher_prompt_ids=[[-1], [5]]), r"teacher_prompt_ids\[0\] has token ids outside"),
        (dict(response_mask=[[1, 1]]), "response_mask has 1 entries"),
        (dict(response_mask=[[1, 1], [1, 0]]), r"response_mask\[1\] must have 1 entries"),
        (dict(response_mask=[[1, 2], [1]]), r"response_mask\[0\] must contain only 0 and 1"),
        (dict(response_mask=torch.ones(2, 3)), "response_mask has shape"),
        (dict(temperature=float("nan")), "temperature must be finite"),
        (dict(temperature=float("inf")), "temperature must be finite"),
        (dict(temperature=0.0), "temperature must be finite and > 0"),
        (dict(estimator="kl"), "estimator must be one of"),
        (dict(estimator="topk"), "topk must be an int"),
        (dict(estimator="topk", topk=0), "topk must be an int"),
        (dict(estimator="topk", topk=302), "topk must be an int"),
        (dict(estimator="full", topk=5), "topk is only used with estimator='topk'"),
        (dict(chunk_size=0), "chunk_size must be a positive int"),
        (dict(share_prompts="yes"), "share_prompts must be True, False or None"),
        (dict(teacher_rows=[True]), "teacher_rows must be 2 bools"),
        (dict(teacher_rows=[1, 0]), "teacher_rows must be 2 bools"),
        (dict(teacher_rows=torch.ones(2)), r"teacher_rows must be a \[2\] bool tensor"),
        (dict(teacher_rows=torch.ones(3, dtype=torch.bool)), "teacher_rows must be a"),
    ], dict(prompt_ids=p, teacher_prompt_ids=t, response_ids=r)


@pytest.mark.parametrize("index", range(len(_bad_calls()[0])))
def test_bad_input_raises_value_error_naming_the_argument(index):
    model = _model("llama", num_layers=1)
    cases, base = _bad_calls()
    overrides, message = cases[index]
    kwargs = {**base, **overrides}
    with pytest.raises(ValueError, match=message):
        token_signals(model, kwargs.pop("prompt_ids"), kwargs.pop("teacher_prompt_ids"),
                      kwargs.pop("response_ids"), **kwargs)


# --- shared prompts -----------------------------------------------------------------------------

# A GRPO-like batch: groups of rows with one prompt (and one teacher prompt) each, interleaved so
# that a group's rows are not adjacent. Prompts A and B have the same length (one cached batch of
# two), C is longer, D is a single token; responses are ragged, one is a single token, one has an
# observation span.
SHARED_GROUPS = ("A", "C", "A", "B", "D", "A", "C", "B")
SHARED_PROMPT_LENGTHS = {"A": 6, "B": 6, "C": 10, "D": 1}
SHARED_TEACHER_LENGTHS = {"A": 13, "B": 4, "C": 13, "D": 7}
SHARED_RESPONSE_LENGTHS = (7, 12, 1, 9, 3, 5, 2, 8)
SHARED_OBSERVATION = (1, slice(4, 8))
# k3 = r - 1 - log r: its error is about r times the log ratio's error, so its relative error is
# the log ratio's absolute error, a few 1e-6 per float32 log-prob of ~10 nats in these peaked
# models; the two passes each add their own rounding (measured up to 1.7e-5 between them).
K3_RTOL = 3e-5


def _shared_batch(vocab: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    prompt = {g: ids(n) for g, n in SHARED_PROMPT_LENGTHS.items()}
    teacher = {g: prompt[g][:3] + ids(n - 3) if n > 3 else ids(n)
               for g, n in SHARED_TEACHER_LENGTHS.items()}
    responses = [ids(n) for n in SHARED_RESPONSE_LENGTHS]
    mask = [[1] * n for n in SHARED_RESPONSE_LENGTHS]
    b, span = SHARED_OBSERVATION
    for t in range(span.start, span.stop):
        mask[b][t] = 0
    return ([prompt[g] for g in SHARED_GROUPS], [teacher[g] for g in SHARED_GROUPS], responses,
            mask)


def _count_backbone_tokens(model) -> list[int]:
    """Record the number of input tokens of every backbone forward (a list that grows)."""
    counts: list[int] = []
    model.base_model.register_forward_pre_hook(
        lambda _module, _args, kwargs: counts.append(kwargs["input_ids"].numel()),
        with_kwargs=True)
    return counts


def _full_forwards(prompts: list[list[int]], responses: list[list[int]]) -> list[int]:
    """Backbone input tokens of one unshared side: one forward on every prompt + response,
    right-padded."""
    return [len(prompts) * max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))]


def _shared_forwards(prompts: list[list[int]], responses: list[list[int]],
                     slack: int = PROMPT_LENGTH_SLACK) -> list[int]:
    """Backbone input tokens of each forward of one shared side: per batch of prompt lengths
    (shortest first; a new batch where a length exceeds the batch's shortest by more than
    ``slack``), its distinct prompts once, padded to the longest, then its rows' responses but
    the last token, padded to the longest (no response forward when every response is one
    token)."""
    batches: list[list[int]] = []
    for length in sorted({len(p) for p in prompts}):
        if batches and length - batches[-1][0] <= slack:
            batches[-1].append(length)
        else:
            batches.append([length])
    out = []
    for lengths in batches:
        distinct = {tuple(p) for p in prompts if len(p) in lengths}
        rows = [r for p, r in zip(prompts, responses, strict=True) if len(p) in lengths]
        out.append(max(lengths) * len(distinct))
        if max(len(r) for r in rows) > 1:
            out.append(len(rows) * (max(len(r) for r in rows) - 1))
    return out


def _assert_close_k3(got: torch.Tensor, want: torch.Tensor, estimator: str, field: str) -> None:
    rtol = K3_RTOL if estimator == "k3" and field == "divergence" else RTOL
    torch.testing.assert_close(got.double(), want.double(), atol=ATOL, rtol=rtol,
                               msg=lambda m: f"{estimator} {field}: {m}")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_shared_prompts_match_naive_and_unshared(arch):
    model = _model(arch)
    prompts, teachers, responses, mask = _shared_batch(301, seed=23)
    ref = naive_signals(model, prompts, teachers, responses, mask, temperature=0.7, topk=17)
    counts = _count_backbone_tokens(model)
    for estimator in DIVERGENCE_KINDS:
        kwargs = dict(temperature=0.7, estimator=estimator,
                      topk=17 if estimator == "topk" else None, response_mask=mask, chunk_size=5)
        counts.clear()
        shared = token_signals(model, prompts, teachers, responses, **kwargs)  # default: shared
        assert counts == (_shared_forwards(teachers, responses)
                          + _shared_forwards(prompts, responses))
        forced = token_signals(model, prompts, teachers, responses, share_prompts=True, **kwargs)
        counts.clear()
        unshared = token_signals(model, prompts, teachers, responses, share_prompts=False,
                                 **kwargs)
        assert counts == _full_forwards(teachers, responses) + _full_forwards(prompts, responses)
        assert torch.equal(shared.mask, unshared.mask)
        for field, name in [("student_logprobs", "student"), ("teacher_logprobs", "teacher"),
                            ("entropy", "entropy"), ("divergence", estimator)]:
            assert torch.equal(getattr(shared, field), getattr(forced, field)), field
            _assert_close_k3(getattr(shared, field), ref[name], estimator, field)
            _assert_close_k3(getattr(shared, field), getattr(unshared, field), estimator, field)
        b, span = SHARED_OBSERVATION
        assert torch.all(shared.student_logprobs[b, span] == 0)
        assert torch.all(shared.divergence[b, span] == 0)
        assert shared.divergence.abs().max() > 0.05


def test_shared_prompts_each_side_decides_alone():
    """With student gradients the student side runs the full pass and the teacher still shares;
    distinct prompts are never shared unless asked."""
    model = _model("qwen3", num_layers=1)
    prompts, teachers, responses, mask = _shared_batch(301, seed=29)
    counts = _count_backbone_tokens(model)
    token_signals(model, prompts, teachers, responses, response_mask=mask,
                  student_requires_grad=True)
    full_student = _full_forwards(prompts, responses)
    assert counts == _shared_forwards(teachers, responses) + full_student
    counts.clear()
    token_signals(model, prompts, teachers, responses, response_mask=mask,
                  student_requires_grad=True, share_prompts=True)
    assert counts == (_shared_forwards(teachers, responses)
                      + _shared_forwards(prompts, responses))
    distinct = [[*p, g] for g, p in enumerate(prompts)]  # every prompt differs
    counts.clear()
    response_logprobs(model, distinct, responses, response_mask=mask)
    assert counts == _full_forwards(distinct, responses)
    counts.clear()
    response_logprobs(model, prompts, responses, response_mask=mask)
    assert counts == _shared_forwards(prompts, responses)
    counts.clear()
    response_logprobs(model, prompts, responses, response_mask=mask, requires_grad=True)
    assert counts == full_student


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_response_logprobs_shared_matches_naive(arch):
    model = _model(arch)
    prompts, teachers, responses, mask = _shared_batch(301, seed=31)
    ref = naive_signals(model, prompts, teachers, responses, mask, temperature=1.3)
    for prompt_ids, name in [(prompts, "student"), (teachers, "teacher")]:
        shared = response_logprobs(model, prompt_ids, responses, temperature=1.3,
                                   response_mask=mask, chunk_size=6)
        unshared = response_logprobs(model, prompt_ids, responses, temperature=1.3,
                                     response_mask=mask, share_prompts=False)
        torch.testing.assert_close(shared.logprobs.double(), ref[name], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(shared.logprobs, unshared.logprobs, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(shared.entropy, unshared.entropy, atol=ATOL, rtol=RTOL)
        assert torch.equal(shared.mask, unshared.mask)
        if name == "student":
            torch.testing.assert_close(shared.entropy.double(), ref["entropy"], atol=ATOL,
                                       rtol=RTOL)


def test_a_model_that_drops_the_prompt_cache_is_scored_without_sharing(monkeypatch):
    """Hugging Face's gradient checkpointing, in train mode, drops every KV cache (TRL turns it
    on by default): the shared-prompt pass must then score each row in full, not score the
    response tokens without their prompt."""
    model = _model("llama")
    prompts, teachers, responses, mask = _shared_batch(301, seed=37)
    want = token_signals(model, prompts, teachers, responses, response_mask=mask,
                         temperature=0.7, share_prompts=False)
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # its dropout is 0: train mode changes nothing else
    got = token_signals(model, prompts, teachers, responses, response_mask=mask,
                        temperature=0.7, share_prompts=True)
    logprobs = response_logprobs(model, prompts, responses, temperature=0.7,
                                 response_mask=mask, share_prompts=True)
    for field in ("student_logprobs", "teacher_logprobs", "entropy", "divergence"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), atol=ATOL,
                                   rtol=RTOL, msg=lambda m, f=field: f"{f}: {m}")
    torch.testing.assert_close(logprobs.logprobs, want.student_logprobs, atol=ATOL, rtol=RTOL)
    # a model that drops the cache unannounced is refused, never scored without its prompts
    from gear_rl.signals import divergence

    monkeypatch.setattr(divergence, "_drops_caches", lambda backbone: False)
    with pytest.raises(ValueError, match="did not fill the shared prompts' KV cache"):
        response_logprobs(model, prompts, responses, response_mask=mask, share_prompts=True)


# ------------------------------------------------------------- k1 / k3 from the sampled token
def _two_token_head() -> torch.nn.Linear:
    """An LM head over a 1-d hidden state with logits ``(h, -h)``: ``log p(token 0) =
    -softplus(-2h)``, about -200 at ``h = -100`` and about 0 at ``h = 100``."""
    head = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    return head


def test_sampled_token_divergence_at_extreme_log_ratios():
    student = torch.tensor([-200.0, 0.0, -1.0, -3.0, -90.0])
    teacher = torch.tensor([0.0, -200.0, -1.0, -2.5, 0.0])  # log ratios 200, -200, 0, 0.5, 90
    k3 = sampled_token_divergence(student, teacher, "k3")
    assert k3.dtype == torch.float32 and torch.isfinite(k3).all() and torch.all(k3 >= 0)
    capped = (teacher.double() - student.double()).clamp(max=MAX_LOG_RATIO)
    torch.testing.assert_close(k3.double(), torch.expm1(capped) - capped, rtol=1e-6, atol=0)
    assert k3[0] == k3[4] == k3.max()  # 200 and 90 are both past the cap (exp(90) is inf)
    assert k3[1] == 199.0  # k3 = e**-200 - 1 + 200: linear, no lower cap needed
    assert k3[2] == 0.0
    k1 = sampled_token_divergence(student, teacher, "k1")
    assert torch.equal(k1, student - teacher)
    with pytest.raises(ValueError, match="estimator"):
        sampled_token_divergence(student, teacher, "full")
    with pytest.raises(ValueError, match="teacher_logprobs"):
        sampled_token_divergence(student, teacher[:2], "k3")


def test_sampled_token_divergence_upcasts_bfloat16():
    """k3 of a small log ratio is ~x**2 / 2, below bf16's resolution: computed in float32."""
    student = torch.tensor([-1.0, -2.0], dtype=torch.bfloat16)
    teacher = torch.tensor([-0.9921875, -2.0], dtype=torch.bfloat16)  # exact in bf16: x = 2**-7
    k3 = sampled_token_divergence(student, teacher, "k3")
    assert k3.dtype == torch.float32
    x = torch.tensor(2.0**-7, dtype=torch.float64)
    torch.testing.assert_close(k3[0].double(), torch.expm1(x) - x, rtol=1e-3, atol=0)
    assert k3[1] == 0.0


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_signal_pass_k1_k3_finite_at_extreme_log_ratios(estimator):
    from gear_rl.signals.divergence import _chunk_signals

    student_hidden = torch.tensor([[-100.0], [100.0], [0.3], [-40.0]])
    teacher_hidden = torch.tensor([[100.0], [-100.0], [0.1], [2.0]])
    targets = torch.zeros(4, dtype=torch.long)
    student, teacher, _entropy, divergence = _chunk_signals(
        _two_token_head(), student_hidden, teacher_hidden, targets, 1.0, estimator, None)
    torch.testing.assert_close((teacher - student)[:2], torch.tensor([200.0, -200.0]))
    assert torch.isfinite(divergence).all()
    assert torch.equal(divergence, sampled_token_divergence(student, teacher, estimator))


# ------------------------------------------------------ shared prompts with gradients (update)
def _parameter_grads(model, loss: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, list(model.parameters())))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_shared_prompt_gradients_match_unshared(arch):
    """The trainer's update path: with gradients, the shared-prompt pass (each distinct prompt
    once, its KV cache part of the graph) gives the unshared pass's parameter gradients, for the
    policy loss's log-probs and entropy and for the distillation's divergence (ragged prompts
    and responses, an observation span).

    Both fp32 paths are held to the unshared pass in float64: the shared one must be as close
    to it as the unshared fp32 pass is (a reordered sum rounds differently, by an amount that
    depends on the processor's kernels: AVX-512 and AVX2 differ), and within a tolerance tied
    to each gradient's scale."""
    model = _model(arch, num_layers=2)
    prompts, teachers, responses, mask = _shared_batch(301, seed=37)
    weights = torch.rand(len(responses), max(len(r) for r in responses),
                         generator=torch.Generator().manual_seed(3)) - 0.5
    counts = _count_backbone_tokens(model)

    def gradients(model, share: bool, weights: torch.Tensor) -> list[torch.Tensor]:
        counts.clear()
        own = response_logprobs(model, prompts, responses, response_mask=mask, chunk_size=5,
                                temperature=0.8, requires_grad=True, share_prompts=share)
        if model.dtype == torch.float32:  # the counting hook sits on the fp32 model
            assert counts == (_shared_forwards if share else _full_forwards)(prompts, responses)
            assert sum(counts) == backbone_tokens(prompts, responses, share_prompts=share)
        policy = _parameter_grads(model, ((own.logprobs + 0.3 * own.entropy) * weights).sum())
        sig = token_signals(model, prompts, teachers, responses, response_mask=mask,
                            chunk_size=5, temperature=0.8, estimator="full",
                            student_requires_grad=True, share_prompts=share)
        distill = _parameter_grads(model, ((sig.student_logprobs + sig.divergence)
                                           * weights).sum())
        return policy + distill

    found = {share: gradients(model, share, weights) for share in (True, False)}
    exact = gradients(copy.deepcopy(model).double(), False, weights.double())
    names = [n for n, _ in model.named_parameters()] * 2
    assert any(g.abs().max() > 1e-3 for g in found[False])
    for name, shared, unshared, want in zip(names, found[True], found[False], exact,
                                            strict=True):
        scale = float(want.abs().max())
        shared_error = float((shared.double() - want).abs().max())
        unshared_error = float((unshared.double() - want).abs().max())
        assert shared_error <= 2 * unshared_error + 1e-6 * scale, (
            f"{arch} {name}: shared pass {shared_error:.3g} from float64, unshared "
            f"{unshared_error:.3g}")
        assert shared_error <= 1e-5 * scale + 1e-7, (
            f"{arch} {name}: shared pass {shared_error:.3g} from float64 at scale {scale:.3g}")


# ------------------------------------------------------ checkpointed layers (update memory)
def _saved_bytes(run) -> tuple[object, int]:
    """``run()``'s result and the bytes autograd saved for the backward while it ran."""
    total = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    return out, total[0]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("share", [True, False])
def test_checkpointed_layers_match_and_save_less(arch, share):
    """``checkpoint_layers=True`` gives the same log-probs, entropy, divergence and parameter
    gradients as the plain pass (shared-prompt KV path included: the prompt pass and the
    response pass are both recomputed in the backward), while autograd keeps far fewer bytes;
    the layers run unwrapped again afterwards."""
    model = _model(arch, num_layers=3)
    prompts, teachers, responses, mask = _shared_batch(301, seed=41)
    weights = torch.rand(len(responses), max(len(r) for r in responses),
                         generator=torch.Generator().manual_seed(5)) - 0.5
    results = {}
    for checkpointed in (False, True):
        def run(checkpointed=checkpointed):
            return token_signals(model, prompts, teachers, responses, response_mask=mask,
                                 chunk_size=7, temperature=0.8, estimator="full",
                                 student_requires_grad=True, share_prompts=share,
                                 checkpoint_layers=checkpointed)
        sig, saved = _saved_bytes(run)
        loss = ((sig.student_logprobs + 0.3 * sig.entropy + sig.divergence) * weights).sum()
        results[checkpointed] = (sig, saved, _parameter_grads(model, loss))
        assert all("forward" not in layer.__dict__ for layer in model.base_model.layers)
    plain, plain_saved, plain_grads = results[False]
    ckpt, ckpt_saved, ckpt_grads = results[True]
    for field in ("student_logprobs", "teacher_logprobs", "entropy", "divergence", "mask"):
        torch.testing.assert_close(getattr(ckpt, field), getattr(plain, field), atol=0, rtol=0)
    assert any(g.abs().max() > 1e-3 for g in plain_grads)
    for (name, _), got, want in zip(model.named_parameters(), ckpt_grads, plain_grads,
                                    strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5,
                                   msg=lambda m, n=name: f"{arch} share={share} {n}: {m}")
    assert ckpt_saved < 0.5 * plain_saved, (ckpt_saved, plain_saved)


def test_checkpointed_layers_response_logprobs_and_refusals():
    """``response_logprobs`` takes the same knob (same values and gradients); without gradients
    it changes nothing; a model with a sliding-window layer is refused on the shared path with a
    pointer to ``share_prompts``, and its layers are restored after the error."""
    model = _model("llama", num_layers=2)
    prompts, _teachers, responses, mask = _shared_batch(301, seed=43)
    outs = [response_logprobs(model, prompts, responses, response_mask=mask, chunk_size=5,
                              requires_grad=True, share_prompts=True, checkpoint_layers=c)
            for c in (False, True)]
    grads = [_parameter_grads(model, (o.logprobs + o.entropy).sum()) for o in outs]
    torch.testing.assert_close(outs[1].logprobs, outs[0].logprobs, atol=0, rtol=0)
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    no_grad = response_logprobs(model, prompts, responses, response_mask=mask,
                                checkpoint_layers=True)
    assert not no_grad.logprobs.requires_grad
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        sliding = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=301, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
            sliding_window=6, max_window_layers=1))
    assert "sliding_attention" in sliding.config.layer_types
    with pytest.raises(ValueError, match="share_prompts"):
        response_logprobs(sliding, prompts, responses, requires_grad=True, share_prompts=True,
                          checkpoint_layers=True)
    assert all("forward" not in layer.__dict__ for layer in sliding.base_model.layers)
    unshared = [response_logprobs(sliding, prompts, responses, requires_grad=True,
                                  share_prompts=False, checkpoint_layers=c) for c in (False, True)]
    torch.testing.assert_close(unshared[1].logprobs, unshared[0].logprobs, atol=0, rtol=0)


def test_prefix_rows_are_selected_inside_each_layer():
    """The read-only prefix cache of the checkpointed shared-prompt pass keeps the prompt
    pass's own states and selects each response's rows in the layer's ``update`` (so the
    selection's backward runs with that layer's, instead of waiting in autograd's queue for
    the whole response pass while holding its key/value gradients), with the same values."""
    from gear_rl.signals.divergence import _PrefixCache

    model = _model("llama", num_layers=2)
    cache = _PrefixCache(model.config)
    shape = (2, model.config.num_key_value_heads, 5, 16)
    states = [(torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True))
              for _ in range(2)]
    for layer, (keys, values) in enumerate(states):
        cache.update(keys * 1.0, values * 1.0, layer)
    index = torch.tensor([1, 0, 1])
    view = cache.selected(index)
    for layer in range(2):
        assert view.layers[layer].keys is cache.layers[layer].keys  # nothing selected yet
        assert view.get_seq_length(layer) == 5
    new = torch.randn(3, shape[1], 4, 16)
    keys, values = view.update(new, new + 1, 1)
    torch.testing.assert_close(keys, torch.cat([states[1][0][index], new], dim=-2),
                               atol=0, rtol=0)
    torch.testing.assert_close(values, torch.cat([states[1][1][index], new + 1], dim=-2),
                               atol=0, rtol=0)
    assert view.get_seq_length(1) == 5  # read-only: nothing appended


@pytest.mark.parametrize("share", [True, False])
def test_entropy_without_gradients_changes_nothing_else(share):
    """``entropy_requires_grad=False`` (the trainer's setting: no loss term differentiates the
    entropy): the same values bit for bit, the same log-prob gradients bit for bit, and, for a
    distillation loss, the same divergence gradients; only the entropy carries no graph, so a
    checkpointed chunk's recomputation stops at the log-probs."""
    model = _model("llama", num_layers=2)
    prompts, teachers, responses, mask = _shared_batch(301, seed=47)
    weights = torch.rand(len(responses), max(len(r) for r in responses),
                         generator=torch.Generator().manual_seed(7)) - 0.5
    runs = {}
    for entropy_grad in (None, False):
        sig = token_signals(model, prompts, teachers, responses, response_mask=mask,
                            chunk_size=5, temperature=0.8, student_requires_grad=True,
                            share_prompts=share, checkpoint_layers=True,
                            entropy_requires_grad=entropy_grad)
        assert sig.entropy.requires_grad is (entropy_grad is None)
        loss = ((sig.student_logprobs + sig.divergence) * weights).sum()
        own = response_logprobs(model, prompts, responses, response_mask=mask, chunk_size=5,
                                requires_grad=True, share_prompts=share,
                                checkpoint_layers=True, entropy_requires_grad=entropy_grad)
        assert own.entropy.requires_grad is (entropy_grad is None)
        runs[entropy_grad] = (sig, own, _parameter_grads(model, loss),
                              _parameter_grads(model, (own.logprobs * weights).sum()))
    (sig_a, own_a, grads_a, own_grads_a), (sig_b, own_b, grads_b, own_grads_b) = runs.values()
    for field in ("student_logprobs", "teacher_logprobs", "entropy", "divergence"):
        torch.testing.assert_close(getattr(sig_b, field), getattr(sig_a, field), atol=0, rtol=0)
    torch.testing.assert_close(own_b.entropy, own_a.entropy, atol=0, rtol=0)
    torch.testing.assert_close(own_b.logprobs, own_a.logprobs, atol=0, rtol=0)
    for got, want in zip([*grads_b, *own_grads_b], [*grads_a, *own_grads_a], strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize(("share", "chunk_size"), [(True, 5), (False, 3), (True, 64)])
def test_teacher_rows_run_the_teacher_on_those_rows_only(share, chunk_size):
    """``teacher_rows``: the student side runs once on every row and gives what the all-rows
    pass gives (values and gradients); the chosen rows' teacher signals equal the all-rows
    pass's; the others are 0 and their teacher prompts never reach the backbone (fewer
    tokens). Chunks of 5 and 3 cut through the chosen rows' boundary; 64 is one chunk."""
    model = _model("qwen3", num_layers=2)
    prompts, teachers, responses, mask = _shared_batch(301, seed=53)
    chosen = [g in ("A", "D") for g in SHARED_GROUPS]  # not a prefix of the batch
    weights = torch.rand(len(responses), max(len(r) for r in responses),
                         generator=torch.Generator().manual_seed(3)) - 0.5
    counts = _count_backbone_tokens(model)
    runs = {}
    for rows in (None, chosen, torch.tensor(chosen)):
        counts.clear()
        sig = token_signals(model, prompts, teachers, responses, response_mask=mask,
                            chunk_size=chunk_size, student_requires_grad=True,
                            share_prompts=share, divergence_requires_grad=False,
                            entropy_requires_grad=False, teacher_rows=rows)
        runs[type(rows).__name__] = (sig, sum(counts), _parameter_grads(
            model, (sig.student_logprobs * weights).sum()))
    (every, every_tokens, every_grads) = runs["NoneType"]
    keep = torch.tensor(chosen)
    for name in ("list", "Tensor"):
        sig, tokens, grads = runs[name]
        assert tokens < every_tokens
        for field in ("student_logprobs", "entropy", "mask"):
            torch.testing.assert_close(getattr(sig, field), getattr(every, field),
                                       atol=1e-6, rtol=1e-6)
        for field in ("teacher_logprobs", "divergence"):
            torch.testing.assert_close(getattr(sig, field)[keep], getattr(every, field)[keep],
                                       atol=1e-6, rtol=1e-6)
            assert (getattr(sig, field)[~keep] == 0).all()
            assert (getattr(every, field)[~keep] != 0).any()
        for got, want in zip(grads, every_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert any(float(g.abs().max()) > 1e-3 for g in every_grads)
    # no row chosen: the student alone, teacher signals all 0, no teacher prompt run
    counts.clear()
    alone = token_signals(model, prompts, teachers, responses, response_mask=mask,
                          chunk_size=chunk_size, share_prompts=share,
                          teacher_rows=[False] * len(responses))
    alone_tokens = sum(counts)
    student = response_logprobs(model, prompts, responses, response_mask=mask,
                                chunk_size=chunk_size, share_prompts=share)
    torch.testing.assert_close(alone.student_logprobs, student.logprobs, atol=0, rtol=0)
    assert (alone.divergence == 0).all() and (alone.teacher_logprobs == 0).all()
    assert alone_tokens == sum(_shared_forwards(prompts, responses) if share
                               else _full_forwards(prompts, responses))
