"""Step 2 of :meth:`gear_rl.train.trainer.Trainer.step`: the step's data records and the no-grad
signal pass that scores them.

- :class:`StepBatch`: what the rollout sampled (ids, rewards, masks, turn spans).
- :class:`Scores`: what the scoring pass computed on it, ``[B, T]`` per field. Under fused
  scoring (:class:`Fusion`) the student's fields are None until the update's forward fills
  them (:meth:`Scores.fill`).
- :class:`SignalPass`: the student's (and teacher's) per-token signals of a list of rows,
  with or without gradients. The scoring pass, the update's forward
  (:mod:`gear_rl.train.update`) and the credit check (:mod:`gear_rl.credit_check`) all run it.
- :class:`Scorer`: the trainer's scoring pass over a :class:`StepBatch`.

The signals themselves are :func:`gear_rl.signals.token_signals` (student and teacher) and
:func:`gear_rl.signals.response_logprobs` (student alone).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from gear_rl.credit import CreditBatch, Estimator, outcome_advantages
from gear_rl.signals import (
    TeacherPromptConfig,
    response_logprobs,
    teacher_prompt_ids,
    token_signals,
)
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.signals.divergence import DivergenceKind
from gear_rl.signals.teacher import Placement, ReferenceKind
from gear_rl.tasks import Problem, check_prompt_lengths

__all__ = ["Fusion", "Scorer", "Scores", "SignalPass", "StepBatch", "check_prompts_fit",
           "pad_columns", "prompt_pair", "score_in_chunks", "teacher_config",
           "teacher_prompt"]


class Fusion(str, enum.Enum):
    """How the update's forward stands in for the no-grad scoring pass (``loss.fuse_scoring``;
    :meth:`gear_rl.train.update.UpdateEngine.fusion` decides). ``None`` where a :class:`Fusion` is
    expected: no fusion, the scoring pass computes every field before the credit.

    BEFORE: the credit reads no student signal (GRPO), so it runs before the update; the
    update's forward supplies the old log-probs and entropy. INLINE: the credit reads the
    student's signals (GEAR, RLSD), so it runs inside the update, on each micro-batch's rows
    between their forward (which supplies the student's and teacher's signals) and their
    backward (:class:`gear_rl.train.update.Credit`)."""

    BEFORE = "before"
    INLINE = "inline"


@dataclass
class StepBatch:
    """One rollout batch (``B`` rows: each problem repeated K times, consecutively).

    Attributes:
        problems: the ``B`` problems. ``group_ids``: their group (problem) index in the step.
        prompt_ids, teacher_ids, response_ids: token ids per row (teacher: the prompt with the
            reference hint).
        finished: ``B`` flags (ended with a stop token). ``texts``: the decoded responses.
        rewards: ``[B]`` outcome rewards.
        policy_masks, turn_ids: per row and token (multi-turn tasks; None otherwise).
        extras: step inputs for the step-level estimators (``CreditBatch.extras``).
        rollout_metrics: agent / environment statistics of the batch.
    """

    problems: list[Problem]
    group_ids: list[int]
    prompt_ids: list[list[int]]
    teacher_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]
    texts: list[str]
    rewards: torch.Tensor
    policy_masks: list[list[int]] | None = None
    turn_ids: list[list[int]] | None = None
    extras: dict[str, Any] | None = None
    rollout_metrics: dict[str, float] | None = None

    def masks(self, rows: Sequence[int]) -> list[list[int]] | None:
        """The policy masks of ``rows`` (None: single-turn, every token is the policy's)."""
        if self.policy_masks is None:
            return None
        return [self.policy_masks[i] for i in rows]


@dataclass
class Scores:
    """The scoring pass over a :class:`StepBatch`; every tensor is ``[B, T]``.

    Attributes:
        mask: 1 on the policy's own tokens, 0 on padding and observations.
        old_logprobs: ``log pi_old(a_t | s_t)`` (PPO's ratio denominator). ``entropy``: nats.
            None until the update's forward fills them where ``fusion`` is set.
        divergence, teacher_logprobs: teacher signals (None when the estimator needs none, and
            under ``Fusion.INLINE`` until the update's forward fills them).
        ref_logprobs: the initial policy's log-probs (None without a KL penalty).
        teacher_rows: ``[B]`` bool, the rows the teacher pass ran on (``signals.teacher_rows``;
            None: every row). The other rows' divergence and teacher log-probs are 0.
        fusion: who computes the student's fields: the scoring pass (None) or the update's
            forward (:class:`Fusion`).
    """

    mask: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    divergence: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    teacher_rows: torch.Tensor | None = None
    fusion: Fusion | None = None

    def credit_batch(self, batch: StepBatch) -> CreditBatch:
        """The estimator's input for ``batch``."""
        return CreditBatch(
            rewards=batch.rewards.to(self.mask.device), group_ids=batch.group_ids,
            mask=self.mask, divergence=self.divergence, entropy=self.entropy,
            student_logprobs=self.old_logprobs, teacher_logprobs=self.teacher_logprobs,
            extras=batch.extras or {},
        )

    def student(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(old_logprobs, entropy)``, each ``[B, T]``: after the scoring pass, or under fused
        scoring after the update has filled them (a ``ValueError`` before)."""
        if self.old_logprobs is None or self.entropy is None:
            raise ValueError("the student's log-probs and entropy are not computed yet: under "
                             "fused scoring the update's forward fills them")
        return self.old_logprobs, self.entropy

    def fill(self, rows: list[int], forward: dict[str, torch.Tensor]) -> None:
        """Write the update forward's detached student fields (and its teacher signals, if it
        ran the teacher) into rows ``rows`` (fused scoring); a field not filled yet starts as
        zeros, which is what a row-local estimator reads for rows still to come."""
        length = forward["logprobs"].shape[1]
        targets = {"logprobs": "old_logprobs", "entropy": "entropy"}
        if "divergence" in forward:
            targets.update(divergence="divergence", teacher_logprobs="teacher_logprobs")
        for name, field in targets.items():
            if getattr(self, field) is None:
                setattr(self, field, torch.zeros_like(self.mask))
            getattr(self, field)[rows, :length] = forward[name].detach().float()


def pad_columns(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Right-pad a ``[B, T]`` tensor with zeros to ``[B, length]`` (or cut it there)."""
    if tensor.shape[1] >= length:
        return tensor[:, :length]
    return torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]))


def score_in_chunks(count: int, batch_size: int, length: int,
                    compute: Callable[[list[int]], dict[str, torch.Tensor]]
                    ) -> dict[str, torch.Tensor]:
    """Run ``compute`` on consecutive chunks of at most ``batch_size`` of ``count`` rows and
    stack its ``[M, T_m]`` outputs into ``[count, length]`` float32 tensors (zero-padded)."""
    parts: dict[str, list[torch.Tensor]] = {}
    for start in range(0, count, batch_size):
        fields = compute(list(range(start, min(start + batch_size, count))))
        for name, value in fields.items():
            parts.setdefault(name, []).append(pad_columns(value.float(), length))
    return {name: torch.cat(values) for name, values in parts.items()}


def teacher_config(placement: str, answer_template: str | None) -> TeacherPromptConfig:
    """The teacher prompt's settings (``signals.placement``, ``signals.answer_template``:
    None keeps :class:`TeacherPromptConfig`'s template). ``placement`` is checked by the
    caller's config (one of ``PLACEMENTS``)."""
    template = {} if answer_template is None else {"answer_template": answer_template}
    return TeacherPromptConfig(placement=cast(Placement, placement), **template)


def teacher_prompt(tokenizer: Any, problem: Problem, config: TeacherPromptConfig) -> list[int]:
    """The teacher prompt ids of ``problem`` (its prompt with the reference hint)."""
    # teacher_prompt_ids checks reference_kind (one of REFERENCE_KINDS)
    return teacher_prompt_ids(tokenizer, problem.prompt, problem.reference,
                              kind=cast(ReferenceKind, problem.reference_kind), config=config)


def prompt_pair(tokenizer: Any, problem: Problem,
                config: TeacherPromptConfig) -> tuple[list[int], list[int]]:
    """The student and teacher prompt ids of ``problem``, built from the problem itself (a
    cache keyed by problem id could pair a row with another row's prompt when ids repeat)."""
    return build_prompt_ids(tokenizer, problem.prompt), teacher_prompt(tokenizer, problem, config)


def check_prompts_fit(tokenizer: Any, model: torch.nn.Module, problems: Iterable[Problem],
                      config: TeacherPromptConfig, *, new_tokens: int, source: str) -> None:
    """Refuse problems whose longer prompt (student or teacher) leaves no room for
    ``new_tokens`` in the model's context (:func:`gear_rl.tasks.check_prompt_lengths`)."""
    check_prompt_lengths(
        ((p.id, max(prompt_pair(tokenizer, p, config), key=len)) for p in problems),
        getattr(getattr(model, "config", None), "max_position_embeddings", None),
        new_tokens=new_tokens, source=source)


@dataclass(frozen=True)
class SignalPass:
    """The per-token signals of rows of (prompt, teacher prompt, response), from ``model``.

    Attributes:
        model: the policy (a Hugging Face causal LM).
        temperature: the sampling temperature the log-probs are taken at.
        chunk_size: LM-head rows per chunk (``signals.chunk_size``).
        divergence, topk: the divergence estimator (``signals.divergence``, ``signals.topk``).
        share_prompts: with gradients, run a prompt shared by several rows once
            (``loss.share_prompts``). checkpoint_layers: with gradients, recompute the
            decoder layers in the backward (``loss.checkpoint_layers``).
        distill: the divergence carries gradients too (self-distillation).
    """

    model: torch.nn.Module
    temperature: float
    chunk_size: int | None
    divergence: str
    topk: int | None
    share_prompts: bool = False
    checkpoint_layers: bool = False
    distill: bool = False

    def __call__(self, prompts: list[list[int]], teachers: list[list[int]] | None,
                 responses: list[list[int]], masks: list[list[int]] | None, *,
                 teacher_rows: torch.Tensor | None = None,
                 requires_grad: bool = False) -> dict[str, torch.Tensor]:
        """The signals of ``M`` rows, each ``[M, T_m]``: ``logprobs``, ``entropy``,
        ``divergence``, ``teacher_logprobs``, ``mask`` (the student's alone, ``logprobs``,
        ``entropy``, ``mask``, where ``teachers`` is None).

        The student runs on every row in one pass; the teacher on the rows ``teacher_rows``
        (``[M]`` bool) marks (all where None; :func:`token_signals`' ``teacher_rows``), and
        where it marks none of them the student runs alone (:func:`response_logprobs`): the
        other rows get zero divergence and teacher log-probs. ``requires_grad``: the update's
        forward (student gradients; the divergence's only for self-distillation; each side's
        prompts shared where ``share_prompts`` and one repeats), else a no-grad pass."""
        model = cast(PreTrainedModel, self.model)
        common: dict[str, Any] = {"temperature": self.temperature,
                                  "chunk_size": self.chunk_size, "response_mask": masks}
        if requires_grad:  # shared where a prompt repeats (else the plain pass)
            common.update(share_prompts=self.share_prompts and len(
                {tuple(p) for p in prompts}) < len(prompts),
                checkpoint_layers=self.checkpoint_layers, entropy_requires_grad=False)
        if teachers is not None and (teacher_rows is None or bool(teacher_rows.any())):
            sig = token_signals(
                model, prompts, teachers, responses,
                estimator=cast(DivergenceKind, self.divergence), topk=self.topk,
                student_requires_grad=requires_grad,
                divergence_requires_grad=requires_grad and self.distill,
                teacher_rows=(None if teacher_rows is None or bool(teacher_rows.all())
                              else teacher_rows), **common)
            return {"logprobs": sig.student_logprobs, "entropy": sig.entropy,
                    "divergence": sig.divergence, "teacher_logprobs": sig.teacher_logprobs,
                    "mask": sig.mask}
        own = response_logprobs(model, prompts, responses, requires_grad=requires_grad,
                                **common)
        out = {"logprobs": own.logprobs, "entropy": own.entropy, "mask": own.mask}
        if teachers is not None:
            zeros = torch.zeros_like(own.mask)
            out.update(divergence=zeros, teacher_logprobs=zeros)
        return out

    def logprobs(self, model: torch.nn.Module, prompts: list[list[int]],
                 responses: list[list[int]], masks: list[list[int]] | None) -> torch.Tensor:
        """``[M, T_m]`` no-grad log-probs of ``responses`` under ``model`` (the teacher's
        prompts, or the reference model) at this pass's temperature and chunking."""
        return response_logprobs(cast(PreTrainedModel, model), prompts, responses,
                                 temperature=self.temperature, chunk_size=self.chunk_size,
                                 response_mask=masks).logprobs


def _policy_mask(batch: StepBatch, rows: list[int]) -> torch.Tensor:
    """``[M, T_m]`` float mask of ``rows``: 1 on the policy's own tokens, 0 on observations
    and padding (what the signal pass returns as ``mask``)."""
    responses = [batch.response_ids[i] for i in rows]
    mask = torch.zeros(len(rows), max(len(r) for r in responses))
    for row, i in enumerate(rows):
        keep = (batch.policy_masks[i] if batch.policy_masks is not None
                else [1] * len(batch.response_ids[i]))
        mask[row, :len(keep)] = torch.tensor(keep, dtype=torch.float32)
    return mask


class Scorer:
    """The trainer's no-grad scoring pass over a :class:`StepBatch` (step 2).

    Args:
        signals: the policy's :class:`SignalPass`.
        estimator, credit_config: the run's credit estimator (which signals it needs).
        needs_teacher: the teacher pass runs (the estimator reads it, or self-distillation).
        teacher_rows: ``signals.teacher_rows`` (``"all"``, or skip the rows whose outcome
            advantage is zero where the estimator allows it).
        batch_size: rows per no-grad pass (``signals.batch_size``).
        reference: the initial policy for the KL penalty, or None.
        autocast: the run's autocast context (``Runtime.autocast_context``).
    """

    def __init__(self, signals: SignalPass, estimator: Estimator, credit_config: Any, *,
                 needs_teacher: bool, teacher_rows: str, batch_size: int,
                 reference: torch.nn.Module | None,
                 autocast: Callable[[], Any]) -> None:
        self.signals, self.estimator, self.credit_config = signals, estimator, credit_config
        self.needs_teacher, self.teacher_rows_setting = needs_teacher, teacher_rows
        self.batch_size, self.reference, self.autocast = batch_size, reference, autocast

    def teacher_rows(self, batch: StepBatch) -> torch.Tensor | None:
        """``[B]`` bool: the rows the teacher pass runs on (``signals.teacher_rows``), or None
        for every row. Skipped: rows with a zero outcome advantage, where the estimator's
        advantage is zero whatever the teacher says (``Estimator.outcome_scaled``), unless a
        self-distillation loss reads the teacher on every row."""
        if (self.teacher_rows_setting == "all" or self.signals.distill
                or not self.estimator.outcome_scaled):
            return None
        return outcome_advantages(batch, self.credit_config) != 0

    @torch.no_grad()
    def __call__(self, batch: StepBatch, fusion: Fusion | None = None) -> Scores:
        """Old log-probs, entropy and (when needed) the teacher signals and reference
        log-probs of ``batch``; no gradients.

        ``fusion`` set: the student's own fields stay None for the update's forward to fill
        (:meth:`Scores.fill`), and only what that forward does not compute runs here: the
        reference log-probs, and the teacher's log-probs where the credit reads them before
        the update."""
        teacher_rows = self.teacher_rows(batch)

        def compute(rows: list[int]) -> dict[str, torch.Tensor]:
            prompts = [batch.prompt_ids[i] for i in rows]
            responses = [batch.response_ids[i] for i in rows]
            masks = batch.masks(rows)
            fields: dict[str, torch.Tensor] = {}
            with self.autocast():
                if fusion is not None:
                    fields["mask"] = _policy_mask(batch, rows)
                    if "teacher_logprobs" in self.estimator.needs:
                        fields["teacher_logprobs"] = self.signals.logprobs(
                            self.signals.model, [batch.teacher_ids[i] for i in rows],
                            responses, masks)
                else:
                    teachers = ([batch.teacher_ids[i] for i in rows] if self.needs_teacher
                                else None)
                    fields = self.signals(
                        prompts, teachers, responses, masks,
                        teacher_rows=None if teacher_rows is None else teacher_rows[rows])
                    fields["old_logprobs"] = fields.pop("logprobs")
                if self.reference is not None:
                    fields["ref_logprobs"] = self.signals.logprobs(self.reference, prompts,
                                                                   responses, masks)
            return fields

        length = max(len(r) for r in batch.response_ids)
        tensors = score_in_chunks(len(batch.response_ids), self.batch_size, length, compute)
        return Scores(**tensors, teacher_rows=teacher_rows if self.needs_teacher else None,
                      fusion=fusion)
