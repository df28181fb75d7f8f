"""Per-token student/teacher log-probs, entropy and reverse KL, chunked over the LM head.

GEAR (Granularity-adaptivE Advantage Reweighting), arXiv 2605.11853, needs for every response
token ``a_t``: the student's log-prob ``log pi(a_t | s_t)`` and entropy ``H_t``, the teacher's
log-prob ``log pi(a_t | s*_t)`` (same model, ground-truth-conditioned prompt, same response
prefix), and the reverse KL ``d_t = KL(pi(.|s_t) || pi(.|s*_t))``. Estimators (DESIGN.md):

- ``full``: ``sum_v p_s(v) (log p_s(v) - log p_t(v))``, exact over the vocabulary;
- ``topk``: the same sum over the student's top-k tokens, both distributions renormalised there;
- ``k1``:   ``log p_s(a_t) - log p_t(a_t)``;
- ``k3``:   ``r - 1 - log r`` with ``r = p_t(a_t) / p_s(a_t)`` (always >= 0).

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

Estimator = Literal["full", "topk", "k1", "k3"]
ESTIMATORS: tuple[str, ...] = ("full", "topk", "k1", "k3")

# Rows per LM-head chunk by default: about 2**23 logits (32 MiB in fp32) per [chunk, V] buffer.
_DEFAULT_CHUNK_ELEMENTS = 2**23


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


def default_chunk_size(vocab_size: int) -> int:
    """Rows per LM-head chunk: about 2**23 logits per chunk, between 16 and 4096 rows."""
    return max(16, min(4096, _DEFAULT_CHUNK_ELEMENTS // max(1, vocab_size)))


def token_signals(
    model: PreTrainedModel,
    prompt_ids: Sequence[Sequence[int]],
    teacher_prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    estimator: Estimator = "full",
    topk: int | None = None,
    response_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
    chunk_size: int | None = None,
    student_requires_grad: bool = False,
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
            :func:`default_chunk_size` for the vocabulary.
        student_requires_grad: keep the autograd graph through the student (for a distillation
            loss); the teacher pass is always gradient-free.

    Returns:
        :class:`TokenSignals`, every field ``[B, max_response_len]`` float32 on the model's device.
    """
    head = model.get_output_embeddings()
    backbone = model.base_model
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
    vocab_size = head.out_features
    embedding_rows = model.get_input_embeddings().num_embeddings
    batch = _batch_size(prompt_ids, teacher_prompt_ids, response_ids)
    students = _id_lists("prompt_ids", prompt_ids, embedding_rows)
    teachers = _id_lists("teacher_prompt_ids", teacher_prompt_ids, embedding_rows)
    responses = _id_lists("response_ids", response_ids, embedding_rows)
    policy = _policy_mask(response_mask, responses)
    temperature = _check_temperature(temperature)
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if estimator == "topk":
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= vocab_size:
            raise ValueError(
                f"topk must be an int in [1, {vocab_size}] for estimator='topk', got {topk!r}"
            )
    elif topk is not None:
        raise ValueError(f"topk is only used with estimator='topk', got topk={topk!r}")
    if chunk_size is None:
        chunk_size = default_chunk_size(vocab_size)
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")

    device = head.weight.device
    max_len = max(len(r) for r in responses)
    # Packed rows: one per trained response token, in (b, t) order.
    rows_b, rows_t = [], []
    for b in range(batch):
        for t, keep in enumerate(policy[b]):
            if keep:
                rows_b.append(b)
                rows_t.append(t)
    out_index = torch.tensor([b * max_len + t for b, t in zip(rows_b, rows_t, strict=True)],
                             dtype=torch.long, device=device)
    targets = torch.tensor([responses[b][t] for b, t in zip(rows_b, rows_t, strict=True)],
                           dtype=torch.long, device=device)

    with torch.no_grad():
        teacher_hidden = _predicting_hidden(backbone, teachers, responses, rows_b, rows_t, device)
    with torch.enable_grad() if student_requires_grad else torch.no_grad():
        student_hidden = _predicting_hidden(backbone, students, responses, rows_b, rows_t, device)
        columns = [[], [], [], []]
        for start in range(0, targets.numel(), chunk_size):
            piece = slice(start, start + chunk_size)
            args = (head, student_hidden[piece], teacher_hidden[piece], targets[piece],
                    temperature, estimator, topk)
            if student_requires_grad:
                values = checkpoint(_chunk_signals, *args, use_reentrant=False)
            else:
                values = _chunk_signals(*args)
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        fields = [_scatter(column, out_index, batch, max_len, device) for column in columns]

    mask = torch.zeros(batch * max_len, dtype=torch.float32, device=device)
    mask[out_index] = 1.0
    student_logprobs, teacher_logprobs, entropy, divergence = fields
    return TokenSignals(
        student_logprobs=student_logprobs,
        teacher_logprobs=teacher_logprobs.detach(),
        entropy=entropy,
        divergence=divergence,
        mask=mask.view(batch, max_len),
    )


def _chunk_signals(
    head: nn.Linear,
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    estimator: str,
    topk: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Signals for ``C`` rows from their predicting hidden states ``[C, H]`` and targets ``[C]``.

    Returns four ``[C]`` fp32 tensors: student log-prob, teacher log-prob, entropy, divergence.
    Peak memory is a handful of ``[C, V]`` fp32 buffers.
    """
    student = _log_softmax(head(student_hidden), temperature)  # [C, V]
    student_logprob = student.gather(-1, targets[:, None]).squeeze(-1)
    student_probs = student.exp()
    entropy = -(student_probs * student).sum(-1)
    with torch.no_grad():
        teacher = _log_softmax(head(teacher_hidden), temperature)  # [C, V]
        teacher_logprob = teacher.gather(-1, targets[:, None]).squeeze(-1)
    if estimator == "full":
        divergence = (student_probs * (student - teacher)).sum(-1)
    elif estimator == "topk":
        student_top, index = student.topk(topk, dim=-1)  # [C, k]
        student_top = student_top - student_top.logsumexp(-1, keepdim=True)
        teacher_top = teacher.gather(-1, index)
        teacher_top = teacher_top - teacher_top.logsumexp(-1, keepdim=True)
        divergence = (student_top.exp() * (student_top - teacher_top)).sum(-1)
    elif estimator == "k1":
        divergence = student_logprob - teacher_logprob
    else:  # k3: r - 1 - log r, r = p_t / p_s; expm1 keeps precision when r is close to 1.
        log_ratio = teacher_logprob - student_logprob
        divergence = (torch.expm1(log_ratio) - log_ratio).clamp_min(0.0)
    return student_logprob, teacher_logprob, entropy, divergence


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def _predicting_hidden(
    backbone: nn.Module,
    prompts: list[list[int]],
    responses: list[list[int]],
    rows_b: list[int],
    rows_t: list[int],
    device: torch.device,
) -> torch.Tensor:
    """Final hidden states ``[N, H]`` at the positions that predict each packed response token.

    Runs the backbone on ``prompt + response`` for every example, right-padded, positions
    ``0..len-1`` per row. Row ``n`` is example ``rows_b[n]``'s position ``P + rows_t[n] - 1``.
    """
    sequences = [p + r for p, r in zip(prompts, responses, strict=True)]
    batch, length = len(sequences), max(len(s) for s in sequences)
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    for b, sequence in enumerate(sequences):
        input_ids[b, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    input_ids = input_ids.to(device)
    position_ids = torch.arange(length, device=device).expand(batch, length)
    hidden = backbone(
        input_ids=input_ids, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [B, L, H]
    flat = torch.tensor(
        [b * length + len(prompts[b]) + t - 1 for b, t in zip(rows_b, rows_t, strict=True)],
        dtype=torch.long, device=device,
    )
    return hidden.reshape(batch * length, -1).index_select(0, flat)


def _scatter(values: list[torch.Tensor], index: torch.Tensor, batch: int, length: int,
             device: torch.device) -> torch.Tensor:
    """Place packed ``[N]`` values at flat ``index`` of a zero ``[B, T]`` fp32 tensor."""
    packed = torch.cat(values) if values else torch.zeros(0, dtype=torch.float32, device=device)
    return packed.new_zeros(batch * length).index_copy(0, index, packed).view(batch, length)


# ---------------------------------------------------------------------------------------------
# Input checks: every failure is a ValueError naming the argument.


def _batch_size(*lists: object) -> int:
    names = ("prompt_ids", "teacher_prompt_ids", "response_ids")
    sizes = []
    for name, value in zip(names, lists, strict=True):
        if isinstance(value, (str, bytes, torch.Tensor)) or not isinstance(value, Sequence):
            raise ValueError(f"{name} must be a list of B token id lists, got "
                             f"{type(value).__name__}")
        sizes.append(len(value))
    if sizes[0] == 0:
        raise ValueError("prompt_ids is empty: the batch needs at least one example")
    for name, size in zip(names[1:], sizes[1:], strict=True):
        if size != sizes[0]:
            raise ValueError(f"{name} has {size} entries but prompt_ids has {sizes[0]}")
    return sizes[0]


def _id_lists(name: str, value: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
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
