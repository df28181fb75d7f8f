"""Per-token student/teacher log-probs, entropy and reverse KL, chunked over the LM head.

GEAR (Granularity-adaptivE Advantage Reweighting), arXiv 2605.11853, needs for every response
token ``a_t``: the student's log-prob ``log pi(a_t | s_t)`` and entropy ``H_t``, the teacher's
log-prob ``log pi(a_t | s*_t)`` (same model, ground-truth-conditioned prompt, same response
prefix), and the reverse KL ``d_t = KL(pi(.|s_t) || pi(.|s*_t))``. Its kinds of estimate
(:data:`DIVERGENCE_KINDS`, docs/design.md):

- ``full``: ``sum_v p_s(v) (log p_s(v) - log p_t(v))``, exact over the vocabulary;
- ``topk``: the same sum over the student's top-k tokens, both distributions renormalised there;
- ``k1``:   ``log p_s(a_t) - log p_t(a_t)``;
- ``k3``:   ``r - 1 - log r`` with ``r = p_t(a_t) / p_s(a_t)`` (always >= 0).

``k1`` and ``k3`` are :func:`sampled_token_divergence`, shared with the verl adapter (its dtype
and capping rule are in its docstring).

All distributions are the temperature-scaled ones the sampler used: ``softmax(logits / T)``.

Alignment: response token ``t`` (0-based) of example ``b`` is predicted by the hidden state at
absolute position ``P_b + t - 1`` of ``prompt + response``, where ``P_b`` is that prompt's length;
the teacher uses its own prompt length. The backbone runs once per side on a right-padded batch
with explicit position ids; right padding needs no attention mask, because a causal model never
lets a real token see the padding that follows it (and leaving the mask out keeps the fused causal
attention kernels). The LM head, log-softmax, entropy and KL then run chunk by chunk over the
trained response positions only, in fp32, so the extra memory is ``O(chunk_size x V)`` and never
``O(B x T x V)``. With ``student_requires_grad=True`` each chunk is checkpointed: backward
recomputes its logits instead of keeping them, which holds the same bound during training.

Shared prompts: GRPO samples K responses per prompt, so a batch repeats each (student and teacher)
prompt K times. A gradient-free side with repeated prompts runs each distinct prompt once with a KV
cache, then all responses against that cache's rows repeated per response (``share_prompts``).
Distinct prompts whose lengths differ by at most ``PROMPT_LENGTH_SLACK`` tokens run together,
right-padded to the longest (the prompt pass needs no mask: the padding comes after every real
token); the response pass is right-padded at positions ``P_b..P_b+R-2`` and needs a mask only
where its cache holds a shorter prompt's padding slots (hidden from that prompt's responses).
A hinted teacher prompt is usually one or two tokens longer or shorter than its neighbours (the
reference answer's length): one batch instead of one per length took the teacher's backbone on
a default-task GEAR batch from 1.29 / 1.25 s to 1.07 / 1.05 s (docs/speed.md).
Response token 0 is predicted by the prompt pass's last hidden state, token ``t > 0`` by response
position ``t - 1``. The result equals the full pass up to float rounding: tested within 1e-5
absolute plus 1e-5 relative (k3, whose error is the log ratio's times ``r``, within 3e-5
relative); on SmolLM2-135M in fp32, log-probs of ~15 nats moved by at most 2e-5.

Layer checkpointing (``checkpoint_layers``, gradient passes only): every decoder layer runs under
non-reentrant activation checkpointing, so the backward keeps one ``[tokens, H]`` input per layer
and recomputes the rest a layer at a time (one extra backbone forward, about a third more update
compute, for activation memory that no longer grows with the layers). Hugging Face's own gradient
checkpointing drops the KV cache, which the shared-prompt pass needs; here the cache is a
:class:`_PrefixCache`, whose ``update`` has no side effect once the prompt is in it (the
response pass reads ``prefix + new`` without appending), so a layer recomputed in the backward
sees exactly what it saw in the forward. Same values and gradients as without it (tested).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, cast, get_args

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

# How the per-token divergence is estimated (``signals.divergence``); not a credit estimator.
DivergenceKind = Literal["full", "topk", "k1", "k3"]
DIVERGENCE_KINDS: tuple[str, ...] = get_args(DivergenceKind)
# The kinds that need only the sampled token's two log-probs (all verl's log-prob pass gives).
SAMPLED_TOKEN_ESTIMATORS: tuple[str, ...] = ("k3", "k1")
# The largest log-ratio log(p_t / p_s) k3 exponentiates (see sampled_token_divergence).
MAX_LOG_RATIO = 64.0
# Shared prompts of lengths within this many tokens of each other run as one padded batch
# (one prompt pass and one response pass instead of one each per length).
PROMPT_LENGTH_SLACK = 8

# Rows per LM-head chunk by default: about 2**25 logits (128 MiB in fp32) per [chunk, V] buffer
# where the head computes in fp32, 2**23 (32 MiB) where it computes in bf16/fp16 (autocast, or a
# 16-bit model). In fp32 the head's matmul is most of a chunk's cost and large chunks run it
# fastest (on a 2-core AVX2 CPU, 170-row chunks ran ~25% slower than 640-row ones; on an AVX-512
# one, the same within noise). In 16 bits the matmul is cheap and the fp32 [chunk, V] buffers
# (the upcast logits, log-softmaxes, probabilities) are the cost: 128 MiB buffers are mapped
# fresh from the OS for every chunk and page-faulted in, 32 MiB ones are reused from the heap
# (glibc's largest dynamic mmap threshold is 32 MiB). Measured on SmolLM2's head (V = 49,152,
# 1,024 rows, bf16 autocast, 2 threads, AMD EPYC with AVX-512 BF16): the update's chunks
# 1.51 s at 682 rows, 1.17 s at 170 (the teacher-free scoring pass 0.74 / 0.62 s); docs/speed.md.
_DEFAULT_CHUNK_ELEMENTS = 2**25
_DEFAULT_CHUNK_ELEMENTS_16BIT = 2**23


@dataclass
class TokenSignals:
    """Per-token signals over the response, every field ``[B, T]`` float32, right-padded.

    ``T`` is the longest response. Fields are 0 wherever ``mask`` is 0 (padding and observation
    tokens). With ``student_requires_grad=True``, ``student_logprobs``, ``entropy`` and
    ``divergence`` carry gradients into the student model; ``teacher_logprobs`` never does.

    Attributes:
        student_logprobs: ``[B, T]`` ``log pi(a_t | s_t)`` at temperature ``T``.
        teacher_logprobs: ``[B, T]`` ``log pi(a_t | s*_t)``.
        entropy: ``[B, T]`` entropy of ``pi(. | s_t)`` in nats.
        divergence: ``[B, T]`` reverse KL estimate student -> teacher in nats (see ``estimator``).
        mask: ``[B, T]`` 1.0 on trained response tokens, 0.0 on padding and observations.
    """

    student_logprobs: torch.Tensor
    teacher_logprobs: torch.Tensor
    entropy: torch.Tensor
    divergence: torch.Tensor
    mask: torch.Tensor


def sampled_token_divergence(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                             estimator: str) -> torch.Tensor:
    """The reverse-KL estimate ``k1`` or ``k3`` of each sampled token from its two log-probs.

    With ``x = log p_t(a) - log p_s(a)`` (teacher minus student):

    - ``k1 = -x``: unbiased for ``KL(p_s || p_t)`` when ``a ~ p_s``; can be negative;
    - ``k3 = r - 1 - log r = expm1(x) - x``: also unbiased, always >= 0, lower variance.

    This is the one implementation: the signal pass (:func:`token_signals`) and the verl
    adapter both call it. Numerics, one rule for every engine:

    - Computed in float32, or in the inputs' dtype where that is wider. bf16 and fp16 inputs are
      upcast first: with bf16's 8 significant bits, ``expm1(x) - x ~ x**2 / 2`` is lost to
      rounding (100% off at ``|x| = 1e-3``, 22% at 1e-2, 4% at 0.1), while float32 keeps it to
      1e-4 relative at ``|x| = 1e-3``, about what the rounding of float32 log-probs near -1
      leaves of ``x`` itself, so float64 would gain nothing. ``expm1`` (not ``exp - 1``) is what
      keeps ``r`` close to 1 that precise.
    - ``x`` is capped at :data:`MAX_LOG_RATIO` (64) before the exponential. float32 and bf16
      share an 8-bit exponent (largest finite value 3.4e38), so ``exp`` overflows to inf in
      both past ``x = 88.7``; at the cap ``k3 <= e**64 ~ 6.2e27``, so that even a float32 sum
      of 2**31 capped tokens (a batch mean) stays finite. Past the cap the teacher finds the
      token more than 6e27 times likelier than the student, and after GEAR's per-trajectory
      normalisation such a token is its trajectory's maximum whatever its exact size. The cap
      passes no gradient, which matters only past it.
    - No lower cap: as ``x -> -inf``, ``k3 ~ -x - 1`` grows only linearly. ``k1`` needs none.

    Args:
        student_logprobs: ``log p_s(a_t)``, any shape (``[B, T]``, or ``[C]`` in the chunked
            pass); may carry gradients.
        teacher_logprobs: ``log p_t(a_t)``, the same shape.
        estimator: ``"k1"`` or ``"k3"``.

    Returns:
        The divergence, the inputs' shape, in float32 (or the inputs' wider dtype).
    """
    if estimator not in SAMPLED_TOKEN_ESTIMATORS:
        raise ValueError(
            f"estimator must be one of {SAMPLED_TOKEN_ESTIMATORS}, got {estimator!r}"
        )
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(
            f"teacher_logprobs has shape {tuple(teacher_logprobs.shape)}, student_logprobs has "
            f"{tuple(student_logprobs.shape)}"
        )
    dtype = torch.promote_types(torch.promote_types(student_logprobs.dtype,
                                                    teacher_logprobs.dtype), torch.float32)
    log_ratio = teacher_logprobs.to(dtype) - student_logprobs.to(dtype)
    if estimator == "k1":
        return -log_ratio
    log_ratio = log_ratio.clamp(max=MAX_LOG_RATIO)
    return (torch.expm1(log_ratio) - log_ratio).clamp_min(0.0)


def default_chunk_size(vocab_size: int, half_precision: bool = False) -> int:
    """Rows per LM-head chunk: about 2**25 logits per chunk (2**23 where the head computes in
    bf16/fp16, ``half_precision``), between 16 and 4096 rows."""
    elements = _DEFAULT_CHUNK_ELEMENTS_16BIT if half_precision else _DEFAULT_CHUNK_ELEMENTS
    return max(16, min(4096, elements // max(1, vocab_size)))


def backbone_tokens(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                    *, share_prompts: bool) -> int:
    """Token positions one backbone pass over these rows runs, padding included: the memory
    of a forward/backward grows with it (the trainer packs micro-batches by it).

    Unshared: ``B x max(P_b + R_b)`` (one right-padded batch). Shared (each distinct prompt
    once, see :func:`_shared_prompt_hidden`): per batch of distinct prompts
    (:func:`prompt_buckets`), ``G x max P`` for its ``G`` prompts plus ``M x (max R - 1)`` for
    the ``M`` responses after them.
    """
    if not share_prompts:
        return len(prompt_ids) * max(len(p) + len(r)
                                     for p, r in zip(prompt_ids, response_ids, strict=True))
    longest: dict[tuple[int, ...], int] = {}  # per distinct prompt: its longest response
    members: dict[tuple[int, ...], int] = {}
    for prompt, response in zip(prompt_ids, response_ids, strict=True):
        key = tuple(prompt)
        longest[key] = max(longest.get(key, 0), len(response))
        members[key] = members.get(key, 0) + 1
    return sum(len(bucket) * len(bucket[-1])
               + sum(members[p] for p in bucket) * (max(longest[p] for p in bucket) - 1)
               for bucket in prompt_buckets(list(longest)))


def token_signals(
    model: PreTrainedModel,
    prompt_ids: Sequence[Sequence[int]],
    teacher_prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    estimator: DivergenceKind = "full",
    topk: int | None = None,
    response_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
    chunk_size: int | None = None,
    student_requires_grad: bool = False,
    share_prompts: bool | None = None,
    divergence_requires_grad: bool | None = None,
    checkpoint_layers: bool = False,
    entropy_requires_grad: bool | None = None,
    teacher_rows: Sequence[bool] | torch.Tensor | None = None,
) -> TokenSignals:
    """Score ``B`` responses under the student prompts and the teacher prompts.

    Args:
        model: a Hugging Face causal LM (Llama-, Qwen2-, Qwen3-style: a backbone at
            ``model.base_model`` and a linear LM head). Its device and dtype are used as they are;
            the head's output is upcast to fp32 before any softmax.
        prompt_ids: ``B`` student prompts, token id lists of any (non-zero) lengths.
        teacher_prompt_ids: ``B`` teacher prompts (lengths may differ from the student's).
        response_ids: ``B`` responses, non-empty id lists of any lengths; scored after both
            prompts. May contain observation tokens (see ``response_mask``).
        temperature: finite, > 0; every distribution is ``softmax(logits / temperature)``.
        estimator: ``"full"``, ``"topk"``, ``"k1"`` or ``"k3"`` (see the module docstring).
        topk: the support size for ``estimator="topk"`` (required there, refused elsewhere).
        response_mask: per response, 1 for a policy token and 0 for an observation token (kept
            in the context, zero in the output): ``B`` lists matching the responses' lengths, or a
            ``[B, T]`` tensor (entries past a response's end are ignored). ``None``: all 1.
        chunk_size: response positions per LM-head chunk; ``None`` picks
            :func:`default_chunk_size` for the vocabulary and the head's precision (16-bit
            under bf16/fp16 autocast or with 16-bit weights).
        student_requires_grad: keep the autograd graph through the student (for a distillation
            loss); the teacher pass is always gradient-free.
        share_prompts: run each distinct prompt once and its responses against a shared KV cache
            (module docstring); the outputs are the same up to float rounding. ``None``: per side
            (student, teacher), where that side needs no gradient and some prompt repeats.
            ``True`` / ``False``: on / off for both sides (``True`` keeps gradients exact too).
        divergence_requires_grad: with ``student_requires_grad``, whether ``divergence``
            carries gradients too (a distillation loss needs them; ``None``: the same as
            ``student_requires_grad``). ``False`` computes it, and everything of the teacher's,
            after the last gradient-carrying value of each checkpointed chunk, so the backward's
            recomputation stops before them (non-reentrant checkpointing stops once every
            saved tensor is back): a policy-gradient update that only reads the divergence as
            a signal (GEAR's fused credit) does not pay the teacher's LM head again.
        checkpoint_layers: with ``student_requires_grad``, run the student's backbone with
            every decoder layer checkpointed (module docstring): activation memory of one
            ``[tokens, H]`` tensor per layer, for one more backbone forward in the backward.
        entropy_requires_grad: with ``student_requires_grad``, whether ``entropy`` carries
            gradients (an entropy bonus needs them; ``None``: the same as
            ``student_requires_grad``). ``False`` computes it without gradients, after the
            log-probs (:func:`_student_side`): same values, and a loss that never reads the
            entropy's gradient (the trainer's) no longer has each chunk's recomputation build
            the entropy's ``[C, V]`` graph, whose saved tensors nobody unpacks and which
            therefore stayed alive until the end of the backward.
        teacher_rows: ``[B]`` bools, the examples the teacher pass runs on (``None``: all).
            The student side always runs on every example, in one pass; the others get 0
            teacher log-probs and divergence (their teacher prompts are not run). For a credit
            that is zero on those rows whatever the teacher says (the trainer's
            ``signals.teacher_rows``): the teacher's backbone and LM head then run on the
            chosen rows only, and the student's LM head runs in the same chunks as without it.

    Returns:
        :class:`TokenSignals`, every field ``[B, max_response_len]`` float32 on the model's device.
    """
    backbone, head = _model_parts(model)
    vocab_size = head.out_features
    _batch_size(prompt_ids=prompt_ids, teacher_prompt_ids=teacher_prompt_ids,
                response_ids=response_ids)
    students = _id_lists("prompt_ids", prompt_ids, model)
    teachers = _id_lists("teacher_prompt_ids", teacher_prompt_ids, model)
    responses = _id_lists("response_ids", response_ids, model)
    rows = _Rows(_policy_mask(response_mask, responses), responses, head.weight.device)
    temperature = _check_temperature(temperature)
    if estimator not in DIVERGENCE_KINDS:
        raise ValueError(f"estimator must be one of {DIVERGENCE_KINDS}, got {estimator!r}")
    if estimator == "topk":
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= vocab_size:
            raise ValueError(
                f"topk must be an int in [1, {vocab_size}] for estimator='topk', got {topk!r}"
            )
    elif topk is not None:
        raise ValueError(f"topk is only used with estimator='topk', got topk={topk!r}")
    chunk_size = _check_chunk_size(chunk_size, head)
    divergence_grad = _part_grad(divergence_requires_grad, student_requires_grad)
    entropy_grad = _part_grad(entropy_requires_grad, student_requires_grad)
    share_student = _share_prompts(share_prompts, students, requires_grad=student_requires_grad)

    taught = _taught_examples(teacher_rows, len(responses))
    # packed tokens, the taught examples' first: each chunk's teacher rows are a prefix of it
    order = None if len(taught) in (0, len(responses)) else rows.taught_first(taught)
    taught_teachers = [teachers[b] for b in taught]
    with torch.no_grad():
        teacher_hidden = (_predicting_hidden(
            backbone, taught_teachers, [responses[b] for b in taught], rows.subset(taught),
            _share_prompts(share_prompts, taught_teachers, requires_grad=False))
            if taught else rows.targets.new_zeros(0, head.in_features, dtype=torch.float32))
    with torch.enable_grad() if student_requires_grad else torch.no_grad():
        student_hidden = _predicting_hidden(backbone, students, responses, rows, share_student,
                                            checkpoint_layers and student_requires_grad)
        _drop_backbone_casts(student_requires_grad)
        targets = rows.targets
        if order is not None:
            student_hidden, targets = student_hidden[order], targets[order]
        student_logprobs, teacher_logprobs, entropy, divergence = (rows.scatter(
            packed, order) for packed in _chunked(
            _chunk_signals, 4, targets, head, (student_hidden, teacher_hidden),
            (temperature, estimator, topk, divergence_grad, entropy_grad), chunk_size,
            student_requires_grad,
        ))
    return TokenSignals(
        student_logprobs=student_logprobs,
        teacher_logprobs=teacher_logprobs.detach(),
        entropy=entropy,
        divergence=divergence,
        mask=rows.mask(),
    )


@dataclass
class ResponseScores:
    """Per-token scores of responses under one prompt each, ``[B, T]`` float32, right-padded.

    Attributes:
        logprobs: ``[B, T]`` ``log pi(a_t | prompt, a_<t)`` at the given temperature.
        entropy: ``[B, T]`` entropy of that distribution in nats.
        mask: ``[B, T]`` 1.0 on scored response tokens, 0.0 on padding and observations.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor


def response_logprobs(
    model: PreTrainedModel,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    response_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
    chunk_size: int | None = None,
    requires_grad: bool = False,
    share_prompts: bool | None = None,
    checkpoint_layers: bool = False,
    entropy_requires_grad: bool | None = None,
) -> ResponseScores:
    """One side of :func:`token_signals`: the sampled tokens' log-probs and the entropy of
    ``B`` responses after their prompts, with the same alignment, chunking, checks and memory
    bound. For a policy-gradient loss (``requires_grad=True``), for old/reference log-probs, or
    for the teacher pass alone.

    Args and shapes as in :func:`token_signals` (``requires_grad`` is its
    ``student_requires_grad``; ``share_prompts=None`` shares repeated prompts when
    ``requires_grad`` is False; ``checkpoint_layers`` and ``entropy_requires_grad`` act with
    ``requires_grad``). Returns :class:`ResponseScores`.
    """
    backbone, head = _model_parts(model)
    _batch_size(prompt_ids=prompt_ids, response_ids=response_ids)
    prompts = _id_lists("prompt_ids", prompt_ids, model)
    responses = _id_lists("response_ids", response_ids, model)
    rows = _Rows(_policy_mask(response_mask, responses), responses, head.weight.device)
    temperature = _check_temperature(temperature)
    chunk_size = _check_chunk_size(chunk_size, head)
    share = _share_prompts(share_prompts, prompts, requires_grad=requires_grad)
    with torch.enable_grad() if requires_grad else torch.no_grad():
        hidden = _predicting_hidden(backbone, prompts, responses, rows, share,
                                    checkpoint_layers and requires_grad)
        _drop_backbone_casts(requires_grad)
        entropy_grad = _part_grad(entropy_requires_grad, requires_grad)
        logprobs, entropy = (rows.scatter(packed) for packed in _chunked(
            _chunk_scores, 2, rows.targets, head, (hidden,), (temperature, entropy_grad),
            chunk_size, requires_grad))
    return ResponseScores(logprobs=logprobs, entropy=entropy, mask=rows.mask())


class _Rows:
    """The packed rows: one per scored response token, in (example, position) order.

    ``example`` and ``position`` are ``[N]`` long tensors, ``out_index = example * T + position``
    its flat index in the ``[B, T]`` outputs, ``targets`` the ``[N]`` response token ids.
    """

    def __init__(self, policy: list[list[bool]], responses: list[list[int]],
                 device: torch.device) -> None:
        self.policy, self.responses = policy, responses
        self.batch, self.length = len(responses), max(len(r) for r in responses)
        self.device = device
        padded_ids = torch.zeros(self.batch, self.length, dtype=torch.long)
        padded_mask = torch.zeros(self.batch, self.length, dtype=torch.bool)
        for b, (ids, keep) in enumerate(zip(responses, policy, strict=True)):
            padded_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            padded_mask[b, : len(keep)] = torch.tensor(keep, dtype=torch.bool)
        out_index = padded_mask.flatten().nonzero().squeeze(-1)
        self.out_index = out_index.to(device)
        self.example = (out_index // self.length).to(device)
        self.position = (out_index % self.length).to(device)
        self.targets = padded_ids.flatten()[out_index].to(device)

    def scatter(self, packed: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
        """Place packed ``[N]`` values into a zero ``[B, T]`` float32 tensor; ``order`` ``[N]``:
        value ``n`` is packed token ``order[n]``'s (None: packed order)."""
        index = self.out_index if order is None else self.out_index[order]
        flat = packed.new_zeros(self.batch * self.length).index_copy(0, index, packed)
        return flat.view(self.batch, self.length)

    def subset(self, examples: list[int]) -> _Rows:
        """The packed rows of ``examples`` alone (in their order)."""
        return _Rows([self.policy[b] for b in examples], [self.responses[b] for b in examples],
                     self.device)

    def taught_first(self, examples: list[int]) -> torch.Tensor:
        """``[N]`` long: the packed tokens of ``examples`` (ascending), in packed order, then the
        others': the first ones line up with :meth:`subset`'s packed rows."""
        chosen = torch.zeros(self.batch, dtype=torch.bool, device=self.device)
        chosen[torch.tensor(examples, dtype=torch.long, device=self.device)] = True
        taught = chosen[self.example]
        return torch.cat([taught.nonzero().squeeze(-1), (~taught).nonzero().squeeze(-1)])

    def mask(self) -> torch.Tensor:
        mask = torch.zeros(self.batch * self.length, dtype=torch.float32, device=self.device)
        mask[self.out_index] = 1.0
        return mask.view(self.batch, self.length)


def _chunked(fn: Callable[..., tuple[torch.Tensor, ...]], outputs: int, targets: torch.Tensor,
             head: nn.Linear, hidden: tuple[torch.Tensor, ...], options: tuple,
             chunk_size: int, requires_grad: bool) -> list[torch.Tensor]:
    """Run ``fn(head, *(h[chunk] for h in hidden), targets[chunk], *options)`` over chunks of the
    ``[N]`` packed targets and concatenate each of its ``outputs`` ``[C]`` results into ``[N]``
    (a hidden tensor shorter than ``N`` gives the later chunks a shorter slice, or none).
    With gradients, each chunk is checkpointed: backward recomputes the chunk's ``[C, V]``
    buffers instead of keeping every chunk's alive until then."""
    columns: list[list[torch.Tensor]] = [[] for _ in range(outputs)]
    for start in range(0, targets.numel(), chunk_size):
        piece = slice(start, start + chunk_size)
        args = (head, *(h[piece] for h in hidden), targets[piece], *options)
        if requires_grad:
            values = checkpoint(fn, *args, use_reentrant=False)
        else:
            values = fn(*args)
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return [torch.cat(column) if column
            else torch.zeros(0, dtype=torch.float32, device=targets.device)
            for column in columns]


def _chunk_scores(head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor,
                  temperature: float, entropy_grad: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` ``[C]`` and entropy ``[C]`` from hidden states ``[C, H]``."""
    _logprobs, logprob, _probs, entropy = _student_side(head, hidden, targets, temperature,
                                                        entropy_grad)
    return logprob, entropy


def _student_side(head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor,
                  temperature: float, entropy_grad: bool, probs_grad: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The student's ``[C, V]`` log-softmax and probabilities and its ``[C]`` target log-prob
    and entropy, from hidden states ``[C, H]``. The probabilities and the entropy come after
    the target log-prob, each with gradients only where asked (``probs_grad``, for the
    divergence; ``entropy_grad``, which implies the probabilities'), so that in a checkpointed
    chunk the target log-prob can be the last value the backward's recomputation needs
    (non-reentrant checkpointing stops there) and no graph is built for an entropy whose
    gradient nobody reads (its saved ``[C, V]`` tensors would live, unread, until the backward
    ends)."""
    logprobs = _log_softmax(head(hidden), temperature)  # [C, V]
    logprob = logprobs.gather(-1, targets[:, None]).squeeze(-1)
    with contextlib.nullcontext() if entropy_grad or probs_grad else torch.no_grad():
        probs = logprobs.exp()
    with contextlib.nullcontext() if entropy_grad else torch.no_grad():
        entropy = -_rowwise_dot(probs, logprobs)
    return logprobs, logprob, probs, entropy


def _part_grad(part_requires_grad: bool | None, requires_grad: bool) -> bool:
    """Whether an output part (divergence, entropy) carries gradients: ``None`` follows the
    pass's ``requires_grad``; otherwise the part's flag, and never without the pass's."""
    if part_requires_grad is None:
        return requires_grad
    return bool(part_requires_grad) and requires_grad


def _chunk_signals(
    head: nn.Linear,
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    estimator: str,
    topk: int | None,
    divergence_grad: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Signals for ``C`` rows from their predicting hidden states ``[C, H]`` and targets ``[C]``.

    Returns four ``[C]`` fp32 tensors: student log-prob, teacher log-prob, entropy, divergence.
    Peak memory is a handful of ``[C, V]`` fp32 buffers. ``divergence_grad=False``: the
    divergence is computed without gradients; every gradient-carrying value comes before the
    teacher's head, so a checkpoint's recomputation stops before it. ``entropy_grad=False``:
    the same for the entropy (:func:`_student_side`). ``teacher_hidden`` ``[K, H]``, ``K <= C``:
    the teacher's states of the chunk's first ``K`` rows (``token_signals``' ``teacher_rows``);
    the other rows get 0 teacher log-prob and divergence.
    """
    student, student_logprob, student_probs, entropy = _student_side(
        head, student_hidden, targets, temperature, entropy_grad, probs_grad=divergence_grad)
    rows, taught = targets.shape[0], teacher_hidden.shape[0]
    if taught == 0:
        zeros = student_logprob.new_zeros(rows).detach()
        return student_logprob, zeros, entropy, zeros
    if taught < rows:  # the teacher's rows are a prefix of the chunk
        student, student_probs = student[:taught], student_probs[:taught]
        own_logprob, targets = student_logprob[:taught], targets[:taught]
    else:
        own_logprob = student_logprob
    with torch.no_grad():
        teacher = _log_softmax(head(teacher_hidden), temperature)  # [K, V]
        teacher_logprob = teacher.gather(-1, targets[:, None]).squeeze(-1)
    if divergence_grad:
        divergence = _divergence(student, student_probs, own_logprob, teacher,
                                 teacher_logprob, estimator, topk)
    else:
        with torch.no_grad():
            divergence = _divergence(student.detach(), student_probs.detach(),
                                     own_logprob.detach(), teacher, teacher_logprob,
                                     estimator, topk)
    if taught < rows:
        teacher_logprob = nn.functional.pad(teacher_logprob, (0, rows - taught))
        divergence = nn.functional.pad(divergence, (0, rows - taught))
    return student_logprob, teacher_logprob, entropy, divergence


def _divergence(student: torch.Tensor, student_probs: torch.Tensor,
                student_logprob: torch.Tensor, teacher: torch.Tensor,
                teacher_logprob: torch.Tensor, estimator: str, topk: int | None
                ) -> torch.Tensor:
    """``[C]`` divergence estimate from the student's and the teacher's ``[C, V]``
    log-softmaxes (and the sampled tokens' log-probs, for ``k1`` / ``k3``)."""
    if estimator == "full":
        return _rowwise_dot(student_probs, student - teacher)
    if estimator == "topk":
        # token_signals has checked topk (an int in [1, V]) for estimator='topk'
        student_top, index = student.topk(cast(int, topk), dim=-1)  # [C, k]
        student_top = student_top - student_top.logsumexp(-1, keepdim=True)
        teacher_top = teacher.gather(-1, index)
        teacher_top = teacher_top - teacher_top.logsumexp(-1, keepdim=True)
        return (student_top.exp() * (student_top - teacher_top)).sum(-1)
    return sampled_token_divergence(student_logprob, teacher_logprob, estimator)


def _rowwise_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` for ``[C, V]`` fp32 inputs without the ``[C, V]`` product (a batched
    dot), in fp32: ``[C]`` fp32. Autocast is off here: ``einsum`` lowers to ``bmm``, which
    autocast's CPU and CUDA lists run in bf16/fp16, and that rounded every probability and
    log-prob to 8 significant bits and returned the entropy and the full divergence in bf16
    (entropy near 10 nats off by up to 0.02 and quantised to steps of 1/16), at several times
    the fp32 cost (the inputs' casts)."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        return torch.einsum("cv,cv->c", a, b)


def _drop_backbone_casts(requires_grad: bool) -> None:
    """With gradients under autocast: empty autocast's cache of low-precision weight copies once
    the backbone has run, before the LM-head chunks.

    Autocast keeps the 16-bit copy of every fp32 weight it casts until the outermost autocast
    block exits, so that a weight read again in the block (the shared-prompt pass's prompt and
    response passes, the LM-head chunks) is cast once and its gradient flows through one cast.
    After the backbone's last pass no decoder layer's weight is read again in the pass, and
    with layers checkpointed nothing else holds their copies: on SmolLM2-135M under bf16
    autocast 0.21 GB held through the LM-head chunks, which set the tool-math update forward's
    peak (the trainer then trims the heap before the head, ``runtime.heap_trims``). The LM
    head's weight is cast only after this (the embedding lookup does not autocast), so its
    copy is still shared by every chunk: the graph, values and gradients are the same.
    Without gradients nothing is dropped."""
    if requires_grad and torch.is_autocast_cache_enabled() and torch._C._is_any_autocast_enabled():
        torch.clear_autocast_cache()


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def _predicting_hidden(backbone: nn.Module, prompts: list[list[int]],
                       responses: list[list[int]], rows: _Rows, share_prompts: bool,
                       checkpoint_layers: bool = False) -> torch.Tensor:
    """Final hidden states ``[N, H]`` at the positions that predict each packed response token.

    Runs the backbone on ``prompt + response`` for every example, right-padded, positions
    ``0..len-1`` per row. Packed row ``n`` is example ``b``'s position ``P_b + t - 1``. With
    ``share_prompts``, :func:`_shared_prompt_hidden` computes the same states. With
    ``checkpoint_layers``, every decoder layer runs checkpointed (:func:`_checkpointed_layers`).
    """
    with _checkpointed_layers(backbone, checkpoint_layers):
        if share_prompts and not _drops_caches(backbone):
            return _shared_prompt_hidden(backbone, prompts, responses, rows, checkpoint_layers)
        return _full_pass_hidden(backbone, prompts, responses, rows)


def _drops_caches(backbone: nn.Module) -> bool:
    """True where Hugging Face's own gradient checkpointing is on and the model trains: its
    layers then drop any KV cache (``past_key_values=None``), so a shared prompt's cache would
    come back empty and the responses would be scored without their prompt. TRL turns it on by
    default (``GRPOConfig.gradient_checkpointing``); such a pass scores each row in full."""
    return backbone.training and any(getattr(module, "gradient_checkpointing", False) is True
                                     for module in backbone.modules())


def _full_pass_hidden(backbone: nn.Module, prompts: list[list[int]],
                      responses: list[list[int]], rows: _Rows) -> torch.Tensor:
    """:func:`_predicting_hidden` without shared prompts: one right-padded ``prompt + response``
    batch."""
    sequences = [p + r for p, r in zip(prompts, responses, strict=True)]
    batch, length = len(sequences), max(len(s) for s in sequences)
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    for b, sequence in enumerate(sequences):
        input_ids[b, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    input_ids = input_ids.to(rows.device)
    position_ids = torch.arange(length, device=rows.device).expand(batch, length)
    hidden = backbone(
        input_ids=input_ids, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [B, L, H]
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long,
                                  device=rows.device)
    flat = rows.example * length + prompt_lengths[rows.example] + rows.position - 1
    return hidden.reshape(batch * length, -1).index_select(0, flat)


def _shared_prompt_hidden(backbone: nn.Module, prompts: list[list[int]],
                          responses: list[list[int]], rows: _Rows,
                          checkpointed: bool = False) -> torch.Tensor:
    """:func:`_predicting_hidden`'s ``[N, H]`` states with each distinct prompt run once.

    The distinct prompts are grouped by length (:func:`prompt_buckets`: lengths within
    :data:`PROMPT_LENGTH_SLACK` of each other run together). Each bucket's ``G`` prompts run as
    one right-padded ``[G, P]`` batch into a KV cache (no mask: a causal model's real tokens
    never see the padding after them); the cache rows are repeated for the ``M`` examples with
    those prompts, which then run their responses but the last token, ``[M, R - 1]``
    right-padded, at positions ``P_b..P_b+R-2`` (``P_b`` their own prompt's length), with an
    attention mask hiding the cache's padding slots where a prompt is shorter than the bucket's
    longest. Example ``b``'s states ``[R, H]`` are its prompt's last state (predicting response
    token 0) followed by the response pass's (predicting tokens ``1..R-1``).
    """
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]  # [B]
    device, length = rows.device, rows.length
    examples: list[int] = []  # the example of each row of `states`, bucket after bucket
    states: list[torch.Tensor] = []  # per bucket [M, T, H]
    for bucket in prompt_buckets(list(distinct)):
        local = {distinct[prompt]: i for i, prompt in enumerate(bucket)}
        members = [b for b, p in enumerate(prompt_of) if p in local]
        longest = max(len(prompt) for prompt in bucket)
        prompt_ids = torch.zeros(len(bucket), longest, dtype=torch.long)
        for i, prompt in enumerate(bucket):
            prompt_ids[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        config = cast(PreTrainedConfig, backbone.config)
        cache = _PrefixCache(config) if checkpointed else DynamicCache(config=config)
        prompt_hidden = backbone(
            input_ids=prompt_ids.to(device),
            position_ids=torch.arange(longest, device=device).expand(len(bucket), -1),
            past_key_values=cache, use_cache=True,
        ).last_hidden_state  # [G, P, H]
        if cache.get_seq_length() != longest:  # never score responses without their prompt
            raise ValueError(
                f"{type(backbone).__name__} did not fill the shared prompts' KV cache (it "
                f"holds {cache.get_seq_length()} of {longest} positions), so responses would "
                "be scored without their prompt; set share_prompts=False "
                "(loss.share_prompts=false) for this model")
        which = torch.tensor([local[prompt_of[b]] for b in members], device=device)  # [M]
        own = torch.tensor([len(prompts[b]) for b in members], device=device)  # [M]: P_b
        ends = torch.tensor([len(prompt) - 1 for prompt in bucket], device=device)  # [G]
        last = prompt_hidden[torch.arange(len(bucket), device=device), ends]  # [G, H]
        hidden = last.index_select(0, which)[:, None]  # [M, 1, H]: their prompt's last state
        width = max(len(responses[b]) for b in members) - 1
        if width > 0:
            input_ids = torch.zeros(len(members), width, dtype=torch.long)
            for row, b in enumerate(members):
                input_ids[row, : len(responses[b]) - 1] = torch.tensor(responses[b][:-1])
            if isinstance(cache, _PrefixCache):
                prefix: DynamicCache = cache.selected(which)
            else:
                cache.batch_select_indices(which)
                prefix = cache
            mask = None
            if bool((own < longest).any()):  # hide the padding slots of the shorter prompts
                slots = torch.arange(longest + width, device=device)
                mask = ((slots[None] < own[:, None]) | (slots[None] >= longest)).long()
            response_hidden = backbone(
                input_ids=input_ids.to(device),
                position_ids=own[:, None] + torch.arange(width, device=device)[None],
                attention_mask=mask, past_key_values=prefix, use_cache=True,
            ).last_hidden_state  # [M, R - 1, H]
            hidden = torch.cat([hidden, response_hidden], dim=1)  # [M, R, H]
        states.append(nn.functional.pad(hidden, (0, 0, 0, length - hidden.shape[1])))
        examples.extend(members)
    slot = torch.empty(len(prompts), dtype=torch.long)
    slot[examples] = torch.arange(len(prompts))
    flat = slot.to(device)[rows.example] * length + rows.position
    return torch.cat(states).reshape(len(prompts) * length, -1).index_select(0, flat)


def prompt_buckets(prompts: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """The shared-prompt pass's batches of distinct ``prompts``: in order of length, a new
    batch wherever a prompt is more than :data:`PROMPT_LENGTH_SLACK` tokens longer than its
    batch's shortest (each batch is right-padded to its longest prompt)."""
    out: list[list[tuple[int, ...]]] = []
    for prompt in sorted(prompts, key=len):
        if out and len(prompt) - len(out[-1][0]) <= PROMPT_LENGTH_SLACK:
            out[-1].append(prompt)
        else:
            out.append([prompt])
    return out


class _PrefixCache(DynamicCache):
    """A KV cache for checkpointed layers (module docstring): a layer's ``update`` stores only
    the first time (the prompt pass's forward; its recomputation in the backward gets its own
    states back, unstored), and a :meth:`selected` copy is read-only (``prefix + new`` returned,
    nothing appended), so a recomputed layer sees what it saw in the forward. Full-attention
    layers only."""

    def __init__(self, config: PreTrainedConfig, read_only: bool = False) -> None:
        super().__init__(config=config)
        if any(type(layer) is not DynamicLayer for layer in self.layers):
            raise ValueError(
                "checkpoint_layers with shared prompts needs full-attention layers (no sliding "
                "window); set share_prompts=False (loss.share_prompts=false) for this model")
        self.config, self.read_only = config, read_only
        self.index: torch.Tensor | None = None  # read-only: the prompt rows, per response

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        layer = cast(DynamicLayer, self.layers[layer_idx])
        if self.read_only:
            keys, values = self._states(layer_idx)  # the prompt pass's, [G, kv, P, d]
            index = cast(torch.Tensor, self.index)
            return (torch.cat([keys.index_select(0, index), key_states], dim=-2),
                    torch.cat([values.index_select(0, index), value_states], dim=-2))
        if layer.get_seq_length() > 0:  # the prompt pass recomputed in the backward
            return key_states, value_states
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def _states(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = cast(DynamicLayer, self.layers[layer_idx])
        return cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)

    def selected(self, index: torch.Tensor) -> _PrefixCache:
        """A read-only cache of rows ``index`` ``[M]`` of this one (graph kept).

        The rows are selected inside each layer's ``update``, not here: an ``index_select``
        made before the response pass would sit in autograd's ready queue (ordered by creation)
        until the whole response pass's backward is done, holding each layer's ``[M, kv, P,
        d]`` key and value gradients (and the larger buffers they are views of) meanwhile,
        about 5 MB a layer on a 2,000-token tool-math micro-batch; selected within the
        layer, its backward runs with the layer's and only ``[G, kv, P, d]`` waits for the
        prompt pass."""
        out = _PrefixCache(self.config, read_only=True)
        out.index = index
        for layer_idx, mine in enumerate(out.layers):
            keys, values = self._states(layer_idx)
            mine.lazy_initialization(keys, values)
            cast(DynamicLayer, mine).keys, cast(DynamicLayer, mine).values = keys, values
        return out


@contextlib.contextmanager
def _checkpointed_layers(backbone: nn.Module, enabled: bool) -> Iterator[None]:
    """Within the block, each of ``backbone.layers`` runs under non-reentrant
    :func:`torch.utils.checkpoint.checkpoint` (``enabled``; otherwise nothing changes)."""
    if not enabled:
        yield
        return
    layers = getattr(backbone, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError("checkpoint_layers needs a backbone with its decoder layers at "
                         f".layers (Llama, Qwen2, Qwen3); {type(backbone).__name__} has none")
    own = [layer.__dict__.get("forward") for layer in layers]
    try:
        for layer in layers:
            layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
        yield
    finally:
        for layer, forward in zip(layers, own, strict=True):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward


# ---------------------------------------------------------------------------------------------
# Input checks: every failure is a ValueError naming the argument.


def _share_prompts(share_prompts: object, prompts: list[list[int]], *,
                   requires_grad: bool) -> bool:
    """Resolve ``share_prompts`` for one side: ``None`` means no gradient and a repeated prompt."""
    if share_prompts is None:
        return not requires_grad and len({tuple(p) for p in prompts}) < len(prompts)
    if not isinstance(share_prompts, bool):
        raise ValueError(f"share_prompts must be True, False or None, got {share_prompts!r}")
    return share_prompts


def _taught_examples(teacher_rows: object, batch: int) -> list[int]:
    """The examples ``teacher_rows`` (``[B]`` bools, or None for all) marks, ascending."""
    if teacher_rows is None:
        return list(range(batch))
    if isinstance(teacher_rows, torch.Tensor):
        if teacher_rows.dtype != torch.bool or teacher_rows.shape != (batch,):
            raise ValueError(f"teacher_rows must be a [{batch}] bool tensor (one per example), "
                             f"got {teacher_rows.dtype} of shape {tuple(teacher_rows.shape)}")
        teacher_rows = teacher_rows.tolist()
    if (isinstance(teacher_rows, (str, bytes)) or not isinstance(teacher_rows, Sequence)
            or len(teacher_rows) != batch or not all(isinstance(v, bool) for v in teacher_rows)):
        raise ValueError(f"teacher_rows must be {batch} bools (one per example) or None, got "
                         f"{teacher_rows!r}")
    return [b for b, taught in enumerate(teacher_rows) if taught]


def _batch_size(**lists: object) -> int:
    """All arguments must be lists of the same, non-zero number of token id lists."""
    sizes = {}
    for name, value in lists.items():
        if isinstance(value, (str, bytes, torch.Tensor)) or not isinstance(value, Sequence):
            raise ValueError(f"{name} must be a list of B token id lists, got "
                             f"{type(value).__name__}")
        sizes[name] = len(value)
    first, size = next(iter(sizes.items()))
    if size == 0:
        raise ValueError(f"{first} is empty: the batch needs at least one example")
    for name, other in sizes.items():
        if other != size:
            raise ValueError(f"{name} has {other} entries but {first} has {size}")
    return size


def _model_parts(model: PreTrainedModel) -> tuple[nn.Module, nn.Linear]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    backbone = getattr(model, "base_model", model)
    if not isinstance(head, nn.Linear) or backbone is model:
        raise ValueError(
            "model must be a causal LM with a backbone (model.base_model) and a linear LM head "
            f"(model.get_output_embeddings()); got {type(model).__name__}"
        )
    for attribute in ("final_logit_softcapping", "logit_scale"):
        if getattr(model.config, attribute, None) not in (None, 1.0):
            raise NotImplementedError(
                f"models with config.{attribute} transform the LM head's output; the chunked "
                "pass does not apply that transform yet"
            )
    return backbone, head


def _check_chunk_size(chunk_size: object, head: nn.Linear) -> int:
    """``chunk_size`` checked, or :func:`default_chunk_size` for ``head`` as it computes here
    (16-bit under an enabled bf16/fp16 autocast of its device, or with 16-bit weights)."""
    if chunk_size is None:
        device = head.weight.device.type
        half = (head.weight.dtype in (torch.bfloat16, torch.float16)
                or (torch.is_autocast_enabled(device)
                    and torch.get_autocast_dtype(device) in (torch.bfloat16, torch.float16)))
        return default_chunk_size(head.out_features, half)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def _id_lists(name: str, value: Sequence[Sequence[int]],
              model: PreTrainedModel) -> list[list[int]]:
    vocab_size = cast(int, model.get_input_embeddings().num_embeddings)
    out = []
    for i, ids in enumerate(value):
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex():
                raise ValueError(f"{name}[{i}] must be a 1-D integer tensor or a list of ints")
            ids = ids.tolist()
        elif isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise ValueError(f"{name}[{i}] must be a list of ints, got {type(ids).__name__}")
        ids = list(ids)
        if not ids:
            raise ValueError(f"{name}[{i}] is empty")
        for token in ids:
            if isinstance(token, bool) or not hasattr(token, "__index__"):
                raise ValueError(f"{name}[{i}] must contain ints, got {type(token).__name__}")
        ids = [int(token) for token in ids]
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(
                f"{name}[{i}] has token ids outside [0, {vocab_size}): min {min(ids)}, "
                f"max {max(ids)}"
            )
        out.append(ids)
    return out


def _policy_mask(response_mask: object, responses: list[list[int]]) -> list[list[bool]]:
    lengths = [len(r) for r in responses]
    if response_mask is None:
        return [[True] * n for n in lengths]
    if isinstance(response_mask, torch.Tensor):
        expected = (len(responses), max(lengths))
        if tuple(response_mask.shape) != expected:
            raise ValueError(
                f"response_mask has shape {tuple(response_mask.shape)}, expected {expected} "
                "(B, longest response)"
            )
        rows = [row[:n].tolist() for row, n in zip(response_mask, lengths, strict=True)]
    else:
        if isinstance(response_mask, (str, bytes)) or not isinstance(response_mask, Sequence):
            raise ValueError(f"response_mask must be a list of B lists or a [B, T] tensor, got "
                             f"{type(response_mask).__name__}")
        if len(response_mask) != len(responses):
            raise ValueError(f"response_mask has {len(response_mask)} entries but response_ids "
                             f"has {len(responses)}")
        rows = []
        for i, (row, n) in enumerate(zip(response_mask, lengths, strict=True)):
            row = row.tolist() if isinstance(row, torch.Tensor) else row
            if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != n:
                raise ValueError(f"response_mask[{i}] must have {n} entries (the length of "
                                 f"response_ids[{i}])")
            rows.append(list(row))
    out = []
    for i, row in enumerate(rows):
        if any(value not in (0, 1) for value in row):
            raise ValueError(f"response_mask[{i}] must contain only 0 and 1")
        out.append([bool(value) for value in row])
    return out


def _check_temperature(temperature: object) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a float, got {type(temperature).__name__}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    return float(temperature)
