"""The single-machine GRPO-family trainer: ``gear-rl train``.

One step, top to bottom (:meth:`Trainer.step`):

1. **Rollout.** ``rollout.prompts_per_step`` problems, ``rollout.samples_per_prompt`` (K)
   responses each, sampled with a KV cache until end of turn; agent tasks run multi-turn (tool
   outputs appended as observation tokens), environment tasks play one game per row
   (``gear_rl.train.episodes.collect``, shared with evaluation). Rewards come from the task's
   scorer.
2. **Score** (no grad). The student's log-probs of its sampled tokens (PPO's "old" log-probs)
   and entropy; when the estimator's declaration needs the teacher, the same pass scores the
   responses under the ground-truth-conditioned teacher prompt for the per-token divergence
   (``gear_rl.signals.token_signals``). Returns a :class:`~gear_rl.train.records.Scores`.
3. **Credit.** The registered estimator (``gear_rl.credit.get_estimator``) turns rewards and
   signals into ``[B, T]`` token-level advantages. GEAR (arXiv 2605.11853) is the default.
4. **Update.** PPO clipped surrogate over those advantages (+ optional KL to the initial policy,
   + self-distillation where the estimator declares it or ``loss.opsd_coef`` asks for it),
   ``loss.epochs`` passes of ``loss.minibatches`` AdamW steps with gradient clipping.

Observation tokens stay in the context and get mask 0 in the signals, the credit and the loss.
Everything random is derived from ``(seed, step)``, and checkpoints carry the global RNG states,
so ``resume=RUN_DIR`` logs exactly the metrics an uninterrupted run logs. The run directory's
layout is :mod:`gear_rl.rundir`; what is logged, :mod:`gear_rl.train.records`; the model, task
and sandbox, :mod:`gear_rl.train.runtime`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import PreTrainedModel

from gear_rl.credit import get_estimator, outcome_advantages
from gear_rl.signals import (
    TeacherPromptConfig,
    backbone_tokens,
    response_logprobs,
    teacher_prompt_ids,
    token_signals,
)
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.signals.divergence import Estimator as DivergenceEstimator
from gear_rl.signals.teacher import Placement, ReferenceKind
from gear_rl.tasks import Problem, Task, check_prompt_lengths
from gear_rl.train.checkpoint import save_checkpoint
from gear_rl.train.config import TrainConfig
from gear_rl.train.episodes import collect, step_extras, task_turns
from gear_rl.train.loss import aggregate, kl_penalty, ppo_policy_loss
from gear_rl.train.records import (
    Scores,
    StepBatch,
    batch_metrics,
    format_summary,
    sample_records,
    summarize,
)
from gear_rl.train.runtime import (
    build_runtime,
    evaluate_model,
    heap_trims,
    memory_metrics,
    open_run,
    release_free_memory,
    reset_device_peak,
    resume_config,
    rollout_settings,
    run_evaluation,
    run_path,
    status_bytes,
)

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

# Heap reuse (Trainer._release_between_phases): the phases trim the heap only where the
# resident set exceeds HEAP_GROWTH times the peak after the process's HEAP_CEILING_STEP-th step
# (the second: the optimiser's moments and a whole update's buffers are in by then).
HEAP_CEILING_STEP = 2
HEAP_GROWTH = 1.1

__all__ = ["NonFiniteTrainingError", "StepOutput", "Trainer", "evaluate_model", "format_summary",
           "resume_config", "train"]


class NonFiniteTrainingError(RuntimeError):
    """A NaN or inf reached the loss, the gradients or the weights: the run stops before that
    step's checkpoint, so the last checkpoint on disk is still a good one."""


def _derived_seed(*parts: int) -> int:
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value * 6364136223846793005 + int(part) + 1442695040888963407) % 2**63
    return value


def _pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Right-pad a ``[B, T]`` tensor with zeros to ``[B, length]``."""
    if tensor.shape[1] >= length:
        return tensor[:, :length]
    return torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]))


def _adamw(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW, fused where the parameters' device supports it (CPU and CUDA do)."""
    options: dict[str, Any] = {"lr": config.optim.lr,
                               "betas": (config.optim.beta1, config.optim.beta2),
                               "eps": config.optim.eps, "weight_decay": config.optim.weight_decay}
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **options)
    except RuntimeError:  # a device without the fused kernel
        return torch.optim.AdamW(model.parameters(), **options)


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


@dataclass
class StepOutput:
    """Everything one step computed: the rollout, its scores and the advantages trained on
    (``[B, T]``)."""

    batch: StepBatch
    scores: Scores
    advantages: torch.Tensor


class Trainer:
    """Owns the policy, its sampler copy, the optimiser, the task and the run directory.

    Args:
        config: a :class:`TrainConfig` (``config.resume`` set: continue that run).
        model, tokenizer: an already-loaded policy (tests); None loads ``config.model``.
        task: an already-built task; None builds ``config.task``.
    """

    def __init__(self, config: TrainConfig, *, model: torch.nn.Module | None = None,
                 tokenizer: Any = None, task: Task | None = None) -> None:
        config.validate()
        self.config = config
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        torch.manual_seed(config.seed)
        self.estimator = get_estimator(config.estimator)
        self.credit_config = self.estimator.make_config(**config.credit)
        path = run_path(config)  # fixed first: the sandbox hides it
        self.runtime = build_runtime(config, model=model, tokenizer=tokenizer, task=task,
                                     run_dir=path)
        runtime = self.runtime
        self.model, self.tokenizer, self.task = runtime.model, runtime.tokenizer, runtime.task
        self.stop_ids, self.pad_id = runtime.stop_ids, runtime.pad_id
        try:
            self._check_task_estimator()
            self.reference = None
            if config.loss.kl_coef > 0:
                import copy

                self.reference = copy.deepcopy(self.model).requires_grad_(False)
            self.distill = self.estimator.self_distillation or config.loss.opsd_coef > 0
            # None: multi-turn tasks (agent, environment) checkpoint their long rows' layers
            self.checkpoint_layers = (
                config.loss.checkpoint_layers if config.loss.checkpoint_layers is not None
                else task_turns(self.task) is not None)
            self.needs_teacher = self.distill or self.estimator.needs_teacher
            template = ({} if config.signals.answer_template is None
                        else {"answer_template": config.signals.answer_template})
            # config.validate has checked signals.placement (one of PLACEMENTS)
            self.teacher_config = TeacherPromptConfig(
                placement=cast(Placement, config.signals.placement), **template)
            # the longer of each problem's student and teacher prompts must fit the context
            check_prompt_lengths(
                ((p.id, max(self._prompts(p), key=len))
                 for p in (*self.task.train, *self.task.eval)),
                getattr(self.model.config, "max_position_embeddings", None),
                new_tokens=max(config.rollout.max_new_tokens, config.eval.max_new_tokens),
                source=self.task.name)
            # fused: one kernel over all parameters, no foreach temporaries (on SmolLM2-135M on
            # CPU about 2.5x faster a step than foreach, with 0.5 GB less peak memory)
            self.optimizer = _adamw(self.model, config)
            self.run, self.start_step = open_run(config, runtime, self.optimizer, path)
        except BaseException:
            runtime.close()
            raise
        self.run_dir = self.run.path
        self.writer = None
        if config.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run.tensorboard), purge_step=self.start_step + 1)
        self.history: list[dict[str, Any]] = self.run.read_metrics()
        # heap reuse: the resident set above which the phases trim the heap after all (set
        # once this process has run HEAP_CEILING_STEP steps; _release_between_phases)
        self._heap_ceiling: float | None = None
        self._steps_run = 0

    @property
    def sampler(self) -> torch.nn.Module:
        return self.runtime.sampler

    @property
    def sandbox(self) -> PythonSandbox | None:
        return self.runtime.sandbox

    def _check_task_estimator(self) -> None:
        """Step-level estimators need turns (agent or environment tasks); those that group by
        state also need state keys (environment tasks)."""
        name = self.config.estimator
        if not self.estimator.step_level:
            return
        if self.task.env is None and self.task.agent is None:
            raise ValueError(f"estimator {name!r} assigns credit per turn: use a multi-turn task "
                             "(an environment such as sokoban/keydoor, or tool-math)")
        if self.task.env is None and self.estimator.requires_states(self.credit_config):
            raise ValueError(f"estimator {name!r} groups steps by environment state: use an "
                             "environment task (sokoban, keydoor); tool tasks have turns only "
                             "(estimator=turn_level)")
        agent = self.task.agent
        if agent is not None and not (agent.turn_reward_tool or agent.turn_reward_answer):
            warnings.warn(f"task {self.task.name!r} pays no turn rewards (AgentSpec."
                          "turn_reward_tool and turn_reward_answer are 0): every turn reward "
                          f"is 0, and {name!r} gives the outcome advantage alone", stacklevel=2)

    def close(self) -> None:
        """Stop the sandbox workers (if any), flush TensorBoard, release the run directory."""
        self.runtime.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if getattr(self, "run", None) is not None:
            self.run.unlock()

    # ------------------------------------------------------------------ helpers
    def _prompts(self, problem: Problem) -> tuple[list[int], list[int]]:
        """The student and teacher prompt ids of ``problem``, built from the problem itself (a
        cache keyed by problem id could pair a row with another row's prompt when ids repeat)."""
        student = build_prompt_ids(self.tokenizer, problem.prompt)
        # teacher_prompt_ids checks reference_kind (one of REFERENCE_KINDS)
        teacher = teacher_prompt_ids(self.tokenizer, problem.prompt, problem.reference,
                                     kind=cast(ReferenceKind, problem.reference_kind),
                                     config=self.teacher_config)
        return student, teacher

    def _problems_for_step(self, step: int) -> list[Problem]:
        """The step's problems: consecutive slices of a per-epoch shuffle of the training set."""
        count, problems = self.config.rollout.prompts_per_step, self.task.train
        out = []
        for j in range(count):
            index = (step - 1) * count + j
            epoch, position = divmod(index, len(problems))
            order = list(range(len(problems)))
            random.Random(_derived_seed(self.config.seed, 17, epoch)).shuffle(order)
            out.append(problems[order[position]])
        return out

    def _lr(self, step: int) -> float:
        warmup = self.config.optim.warmup_steps
        scale = min(1.0, step / warmup) if warmup > 0 else 1.0
        return self.config.optim.lr * scale

    @staticmethod
    def _masks(batch: StepBatch, rows: list[int]) -> list[list[int]] | None:
        """The policy masks of ``rows`` (None: single-turn, every token is the policy's)."""
        if batch.policy_masks is None:
            return None
        return [batch.policy_masks[i] for i in rows]

    # ------------------------------------------------------------------ 1. rollout
    @torch.no_grad()
    def rollout(self, step: int) -> StepBatch:
        """Sample K responses (or episodes) for each of the step's problems and score them."""
        config = self.config.rollout
        k = config.samples_per_prompt
        step_problems = self._problems_for_step(step)
        problems = [p for p in step_problems for _ in range(k)]
        group_ids = [i // k for i in range(len(problems))]
        pairs = [pair for p in step_problems for pair in [self._prompts(p)] * k]
        generator = torch.Generator(device=self.runtime.device).manual_seed(
            _derived_seed(self.config.seed, 1, step))
        rows = collect(self.task, problems, [s for s, _ in pairs], generator=generator,
                       **rollout_settings(self.config, self.runtime))
        return StepBatch(problems=problems, group_ids=group_ids,
                         prompt_ids=[s for s, _ in pairs], teacher_ids=[t for _, t in pairs],
                         response_ids=rows.response_ids, finished=rows.finished,
                         texts=rows.texts, rewards=torch.tensor(rows.rewards),
                         policy_masks=rows.policy_masks, turn_ids=rows.turn_ids,
                         extras=step_extras(rows.step_spans, rows.step_rewards,
                                            rows.state_keys), rollout_metrics=rows.metrics)

    # ------------------------------------------------------------------ 2. score
    @torch.no_grad()
    def score(self, batch: StepBatch, *, student: bool = True) -> Scores:
        """Old log-probs, entropy and (when needed) the teacher signals and reference log-probs
        of ``batch``; no gradients.

        ``student=False`` (the fused on-policy update, :meth:`_fused_mode`): the student's own
        fields are left as zeros for the update's forward to fill, and only what that forward
        does not compute runs here: the reference log-probs, and the teacher's log-probs where
        the credit needs them before the update."""
        size, config = self.config.signals.batch_size, self.config
        length = max(len(r) for r in batch.response_ids)
        teacher_rows = self._teacher_rows(batch)
        parts: dict[str, list[torch.Tensor]] = {}
        for start in range(0, len(batch.response_ids), size):
            rows = list(range(start, min(start + size, len(batch.response_ids))))
            prompts = [batch.prompt_ids[i] for i in rows]
            responses = [batch.response_ids[i] for i in rows]
            common: dict[str, Any] = {"temperature": config.rollout.temperature,
                                      "chunk_size": config.signals.chunk_size,
                                      "response_mask": self._masks(batch, rows)}
            # the policy is a Hugging Face causal LM; signals.divergence is checked by validate
            model = cast(PreTrainedModel, self.model)
            fields: dict[str, torch.Tensor] = {}
            with self.runtime.autocast_context():
                if not student:
                    fields["mask"] = _policy_mask(batch, rows)
                    if "teacher_logprobs" in self.estimator.needs:
                        fields["teacher_logprobs"] = response_logprobs(
                            model, [batch.teacher_ids[i] for i in rows], responses,
                            **common).logprobs
                elif self.needs_teacher:
                    sig = self._signals(batch, rows, teacher_rows, requires_grad=False)
                    fields = {"old_logprobs": sig["logprobs"], "entropy": sig["entropy"],
                              "divergence": sig["divergence"],
                              "teacher_logprobs": sig["teacher_logprobs"], "mask": sig["mask"]}
                else:
                    own = response_logprobs(model, prompts, responses, **common)
                    fields = {"old_logprobs": own.logprobs, "entropy": own.entropy,
                              "mask": own.mask}
                if self.reference is not None:
                    fields["ref_logprobs"] = response_logprobs(
                        cast(PreTrainedModel, self.reference), prompts, responses,
                        **common).logprobs
            for name, value in fields.items():
                parts.setdefault(name, []).append(_pad(value.float(), length))
        tensors = {name: torch.cat(values) for name, values in parts.items()}
        if not student:  # filled by the update's forward
            tensors["old_logprobs"] = torch.zeros_like(tensors["mask"])
            tensors["entropy"] = torch.zeros_like(tensors["mask"])
        return Scores(**tensors, teacher_rows=teacher_rows if self.needs_teacher else None)

    def _teacher_rows(self, batch: StepBatch) -> torch.Tensor | None:
        """``[B]`` bool: the rows the teacher pass runs on (``signals.teacher_rows``), or None
        for every row. Skipped: rows with a zero outcome advantage, where the estimator's
        advantage is zero whatever the teacher says (``Estimator.outcome_scaled``), unless a
        self-distillation loss reads the teacher on every row."""
        if (self.config.signals.teacher_rows == "all" or self.distill
                or not self.estimator.outcome_scaled):
            return None
        return outcome_advantages(batch, self.credit_config) != 0

    def _signals(self, batch: StepBatch, rows: list[int], teacher_rows: torch.Tensor | None,
                 *, requires_grad: bool) -> dict[str, torch.Tensor]:
        """The student's and teacher's signals of ``rows``, each ``[M, T_m]`` in ``rows``'
        order: ``logprobs``, ``entropy``, ``divergence``, ``teacher_logprobs``, ``mask``.

        The student runs on every row in one pass; the teacher on the rows ``teacher_rows``
        marks (all where None; :func:`token_signals`' ``teacher_rows``), and where it marks
        none of them, the student runs alone (:func:`response_logprobs`): the other rows get
        zero divergence and teacher log-probs. ``requires_grad``: the update's forward
        (student gradients; the divergence's only for self-distillation; each side's prompts
        shared where ``loss.share_prompts`` and one repeats), else the no-grad scoring pass."""
        config = self.config
        model = cast(PreTrainedModel, self.model)
        prompts = [batch.prompt_ids[i] for i in rows]
        responses = [batch.response_ids[i] for i in rows]
        common: dict[str, Any] = {"temperature": config.rollout.temperature,
                                  "chunk_size": config.signals.chunk_size,
                                  "response_mask": self._masks(batch, rows)}
        if requires_grad:  # shared where a prompt repeats (else the plain pass)
            common.update(share_prompts=config.loss.share_prompts and len(
                {tuple(p) for p in prompts}) < len(prompts),
                checkpoint_layers=self.checkpoint_layers, entropy_requires_grad=False)
        taught = None if teacher_rows is None else teacher_rows[rows]
        if taught is None or bool(taught.any()):
            sig = token_signals(
                model, prompts, [batch.teacher_ids[i] for i in rows], responses,
                # signals.divergence is checked by validate
                estimator=cast(DivergenceEstimator, config.signals.divergence),
                topk=config.signals.topk, student_requires_grad=requires_grad,
                divergence_requires_grad=requires_grad and self.distill,
                teacher_rows=None if taught is None or bool(taught.all()) else taught,
                **common)
            return {"logprobs": sig.student_logprobs, "entropy": sig.entropy,
                    "divergence": sig.divergence, "teacher_logprobs": sig.teacher_logprobs,
                    "mask": sig.mask}
        own = response_logprobs(model, prompts, responses, requires_grad=requires_grad,
                                **common)
        zeros = torch.zeros_like(own.mask)
        return {"logprobs": own.logprobs, "entropy": own.entropy, "divergence": zeros,
                "teacher_logprobs": zeros, "mask": own.mask}

    def _fused_mode(self, batch: StepBatch) -> str | None:
        """How the update may stand in for the scoring pass (``loss.fuse_scoring``).

        Only on-policy single updates qualify (``loss.epochs=1``, ``loss.minibatches=1``):
        the policy that is updated is then the one whose log-probs the scoring pass would
        compute, so PPO's old log-probs are the update forward's own, detached (ratio 1; TRL
        does the same). Returns ``"before"`` when the estimator reads no student signal (its
        advantages exist before the update: GRPO), ``"inline"`` when it does and either the
        batch packs into one micro-batch or the estimator is ``row_local`` (GEAR, RLSD: the
        credit then runs between each micro-batch's forward and its backward, on that
        micro-batch's rows), None otherwise (the scoring pass runs)."""
        loss = self.config.loss
        if not loss.fuse_scoring or loss.epochs != 1 or loss.minibatches != 1:
            return None
        if not {"divergence", "entropy", "student_logprobs"} & set(self.estimator.needs):
            return "before"
        if self.estimator.row_local or len(
                self._micro_batches(batch, list(range(len(batch.response_ids))))) == 1:
            return "inline"
        return None

    # ------------------------------------------------------------------ 3. credit
    def credit(self, batch: StepBatch, scores: Scores, step: int | None = None) -> torch.Tensor:
        """``[B, T]`` token-level advantages from the registered estimator. ``step`` (1-based)
        reaches estimators with a schedule as ``CreditBatch.step`` (RLSD's ``lam`` decay)."""
        credit_batch = scores.credit_batch(batch)
        credit_batch.step = step
        credit_batch.applies_update_mask = True  # _micro_loss applies the update-time selection
        return self.estimator(credit_batch, self.credit_config).float()

    # ------------------------------------------------------------------ 4. update
    def update(self, batch: StepBatch, scores: Scores, advantages: torch.Tensor | None,
               step: int, *, fused: str | None = None) -> tuple[dict[str, float], torch.Tensor]:
        """``loss.epochs`` x ``loss.minibatches`` AdamW steps on ``batch``.

        ``fused`` (:meth:`_fused_mode`): the forward fills ``scores``' student fields (old
        log-probs, entropy; with ``"inline"`` also the teacher signals) and, with
        ``"inline"``, the credit runs on them before the backward (``advantages`` None).
        Returns the update's metrics and the ``[B, T]`` advantages trained on."""
        config = self.config.loss
        rows = len(batch.response_ids)
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr(step)
        totals = {"loss": 0.0, "pg_loss": 0.0, "kl_loss": 0.0, "opsd_loss": 0.0,
                  "clipped": 0.0, "approx_kl": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        ratio_max, updates, credit_seconds = 1.0, 0, 0.0
        inline = advantages is None
        layers = getattr(self.model.base_model, "layers", None)
        # without heap reuse: hand free pages back every few layers, forward and backward
        trims: Callable[[], contextlib.AbstractContextManager] = (
            functools.partial(heap_trims, layers,
                              head=cast(PreTrainedModel, self.model).get_output_embeddings())
            if not self.runtime.heap_reuse and layers is not None else contextlib.nullcontext)
        if not self.runtime.heap_reuse:  # memory first: the sampler's stale copy goes
            self.runtime.release_sampler()
        try:
            shuffle = torch.Generator().manual_seed(_derived_seed(self.config.seed, 2, step))
            for _ in range(config.epochs):
                order = torch.randperm(rows, generator=shuffle).tolist()
                for split in np.array_split(np.array(order), config.minibatches):
                    minibatch: list[int] = sorted(split.tolist())
                    num_tokens = float(scores.mask[minibatch].sum())
                    micros = self._micro_batches(batch, minibatch)
                    # an estimator that selects tokens per micro-batch (update_mask) fixes how many
                    # from the masks alone: the policy loss's token mean divides by their total
                    counts = [self.estimator.update_token_count(scores.mask[micro],
                                                                self.credit_config)
                              for micro in micros]
                    num_selected = None if None in counts else float(sum(cast(list[float], counts)))
                    self.optimizer.zero_grad(set_to_none=True)
                    for micro in micros:
                        with trims():
                            forward = self._forward(batch, micro, teacher=fused == "inline",
                                                    teacher_rows=scores.teacher_rows)
                        if fused is not None:
                            self._fill_scores(scores, micro, forward)
                        if inline:  # the credit of this micro-batch's rows, now that their
                            # signals are in: a row-local estimator's rows do not read the rows
                            # still unfilled (zeros), and a single micro-batch fills every row
                            mark = time.perf_counter()
                            credit = self.credit(batch, scores, step)
                            if advantages is None:
                                advantages = credit
                            else:
                                advantages[micro] = credit[micro]
                            credit_seconds += time.perf_counter() - mark
                        # set above when inline, given otherwise
                        parts, stats = self._micro_loss(scores, cast(torch.Tensor, advantages),
                                                        micro, forward,
                                                        len(minibatch), num_tokens, num_selected,
                                                        fused=fused is not None)
                        self._check_finite(step, "the loss", parts["loss"])
                        parts["loss"].backward()
                        for name, value in parts.items():
                            totals[name] += float(value.detach())
                        if stats is not None:
                            totals["clipped"] += stats.clipped
                            totals["approx_kl"] += stats.approx_kl
                            totals["tokens"] += stats.tokens
                            ratio_max = max(ratio_max, stats.ratio_max)
                    clip = self.config.optim.grad_clip
                    params = [p for p in self.model.parameters() if p.grad is not None]
                    norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
                    self._check_finite(step, "the gradient norm", norm)
                    totals["grad_norm"] += float(norm)
                    self.optimizer.step()
                    self._check_weights(step)
                    updates += 1
        finally:
            # the gradients are not read again before the next update's zero_grad: free them
            # now, so that the rollout, evaluation and checkpoint do not hold a model's worth
            # of memory
            self.optimizer.zero_grad(set_to_none=True)
            self.runtime.sync_sampler()
        tokens = max(totals.pop("tokens"), 1.0)
        out = {name: value / updates for name, value in totals.items()
               if name not in ("clipped", "approx_kl")}
        out["clip_frac"] = totals["clipped"] / tokens
        out["approx_kl"] = totals["approx_kl"] / tokens
        out["ratio_max"] = ratio_max
        out["lr"] = self._lr(step)
        if fused == "inline":
            out["time/credit"] = credit_seconds
        # every path above sets advantages (given, or by the inline credit)
        return out, cast(torch.Tensor, advantages)

    def _micro_batches(self, batch: StepBatch, minibatch: list[int]) -> list[list[int]]:
        """Pack the rows of ``minibatch`` into micro-batches of at most
        ``loss.micro_batch_tokens`` backbone tokens (:func:`backbone_tokens`, padding included)
        and at most ``loss.micro_batch_size`` rows. With ``loss.share_prompts`` the rows of
        one prompt go together (their prompt then runs once), groups with the longest rows
        first, each group's rows longest first; without it, rows longest first (least
        padding). Greedy and deterministic; a row over the budget alone runs alone."""
        config = self.config.loss
        prompts, responses = batch.prompt_ids, batch.response_ids
        if config.share_prompts:
            longest: dict[tuple[int, ...], int] = {}
            for i in minibatch:
                key = tuple(prompts[i])
                longest[key] = max(longest.get(key, 0), len(responses[i]))
            first = {key: n for n, key in enumerate(dict.fromkeys(
                tuple(prompts[i]) for i in minibatch))}
            order = sorted(minibatch, key=lambda i: (-longest[tuple(prompts[i])],
                                                     first[tuple(prompts[i])],
                                                     -len(responses[i]), i))
        else:
            order = sorted(minibatch, key=lambda i: (-len(prompts[i]) - len(responses[i]), i))
        micros: list[list[int]] = []
        current: list[int] = []
        for i in order:
            candidate = [*current, i]
            too_many = (config.micro_batch_size is not None
                        and len(candidate) > config.micro_batch_size)
            if current and (too_many or backbone_tokens(
                    [prompts[j] for j in candidate], [responses[j] for j in candidate],
                    share_prompts=config.share_prompts) > config.micro_batch_tokens):
                micros.append(current)
                candidate = [i]
            current = candidate
        micros.append(current)
        return micros

    def _check_finite(self, step: int, what: str, value: torch.Tensor) -> None:
        """Stop the run (no checkpoint of this step) when ``value`` is NaN or inf."""
        if bool(torch.isfinite(value).all()):
            return
        last = self.run.latest_checkpoint()
        raise NonFiniteTrainingError(
            f"step {step}: {what} is not finite; the run "
            "stopped before writing this step's checkpoint. Likely causes: optim.lr too high, "
            "loss.kl_coef or loss.opsd_coef too large, or a credit config that divides by zero. "
            + (f"The last good checkpoint is {last}." if last is not None
               else "No checkpoint was written yet."))

    def _check_weights(self, step: int) -> None:
        """The weights' total norm is finite exactly when every weight is (up to an overflow of
        the norm itself, at values no trained model holds): one fused pass and one device sync
        per update; the first bad tensor is named only when it fails."""
        named = [(name, p.detach()) for name, p in self.model.named_parameters()]
        if bool(torch.isfinite(torch.nn.utils.get_total_norm([p for _, p in named]))):
            return
        for name, parameter in named:
            self._check_finite(step, f"the weights ({name})", parameter)
        self._check_finite(step, "the weights' norm (weights too large for any model)",
                           torch.tensor(math.inf))

    def _forward(self, batch: StepBatch, rows: list[int], *, teacher: bool = False,
                 teacher_rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The update's forward over the micro-batch ``rows``, with gradients through the
        student's log-probs: ``logprobs``, ``entropy`` (``[M, T_m]``; no loss term
        differentiates it, so it is computed without gradients), and, for self-distillation or when
        ``teacher`` (the inline credit needs them), the teacher pass's ``divergence`` and
        ``teacher_logprobs`` (on the rows ``teacher_rows`` marks, :meth:`_signals`)."""
        with self.runtime.autocast_context():
            if self.distill or teacher:
                return self._signals(batch, rows, teacher_rows, requires_grad=True)
            nowhere = torch.zeros(len(batch.response_ids), dtype=torch.bool)
            own = self._signals(batch, rows, nowhere, requires_grad=True)
        return {"logprobs": own["logprobs"], "entropy": own["entropy"]}

    @staticmethod
    def _fill_scores(scores: Scores, rows: list[int], forward: dict[str, torch.Tensor]) -> None:
        """Write the fused forward's detached student fields (and teacher signals, if it ran
        the teacher) into ``scores`` rows ``rows``."""
        length = forward["logprobs"].shape[1]
        targets = {"logprobs": "old_logprobs", "entropy": "entropy"}
        if "divergence" in forward:
            if scores.divergence is None:
                scores.divergence = torch.zeros_like(scores.mask)
                scores.teacher_logprobs = torch.zeros_like(scores.mask)
            targets.update(divergence="divergence", teacher_logprobs="teacher_logprobs")
        for name, field in targets.items():
            getattr(scores, field)[rows, :length] = forward[name].detach().float()

    def _micro_loss(self, scores: Scores, advantages: torch.Tensor, rows: list[int],
                    forward: dict[str, torch.Tensor], num_seqs: int, num_tokens: float,
                    num_selected: float | None = None, *, fused: bool = False):
        """Loss of the micro-batch ``rows`` (its :meth:`_forward` outputs ``forward``) scaled
        so micro-batches sum to the mini-batch loss.

        Where the estimator selects tokens at update time (``update_mask``, e.g. top-entropy
        with ``selection=micro_batch``), the policy loss keeps only the tokens it selects by the
        current policy's entropy, and its token mean divides by ``num_selected`` (their count
        over the mini-batch); the KL and self-distillation terms keep every policy token.
        ``fused``: the old log-probs are the forward's own, detached (:meth:`_fused_mode`).

        Returns ``({"loss", "pg_loss", "kl_loss", "opsd_loss"}, PolicyLossStats | None)``.
        """
        config = self.config
        logprobs, entropy = forward["logprobs"], forward["entropy"]
        divergence = forward.get("divergence") if self.distill else None
        length = logprobs.shape[1]
        logprobs = logprobs.float()
        mask = scores.mask[rows, :length]
        agg: dict[str, Any] = {"agg_mode": config.loss.agg_mode, "num_seqs": num_seqs,
               "num_tokens": num_tokens, "horizon": config.rollout.max_new_tokens}
        zero = logprobs.sum() * 0.0
        parts = {"pg_loss": zero, "kl_loss": zero, "opsd_loss": zero}
        stats = None
        if self.estimator.uses_reward:
            pg_mask, pg_agg = mask, agg
            selected = self.estimator.select_for_update(entropy.detach().float(), mask,
                                                        self.credit_config)
            if selected is not None:
                pg_mask = mask * selected.to(mask.dtype)
                pg_agg = {**agg, "num_tokens": (float(pg_mask.sum()) if num_selected is None
                                                else num_selected)}
            old = logprobs.detach() if fused else scores.old_logprobs[rows, :length]
            parts["pg_loss"], stats = ppo_policy_loss(
                logprobs, old, advantages[rows, :length],
                pg_mask, clip_low=config.loss.clip_low, clip_high=config.loss.clip_high,
                **pg_agg)
        if self.reference is not None:
            # score() fills ref_logprobs whenever there is a reference model
            ref_logprobs = cast(torch.Tensor, scores.ref_logprobs)
            kl = kl_penalty(logprobs, ref_logprobs[rows, :length], config.loss.kl_type)
            parts["kl_loss"] = aggregate(kl, mask, agg["agg_mode"], num_seqs=num_seqs,
                                         num_tokens=num_tokens, horizon=agg["horizon"])
        if divergence is not None:
            parts["opsd_loss"] = aggregate(divergence.float(), mask, agg["agg_mode"],
                                           num_seqs=num_seqs, num_tokens=num_tokens,
                                           horizon=agg["horizon"])
        opsd_weight = config.loss.opsd_coef
        if self.estimator.self_distillation and opsd_weight == 0:
            opsd_weight = 1.0
        loss = (parts["pg_loss"] + config.loss.kl_coef * parts["kl_loss"]
                + opsd_weight * parts["opsd_loss"])
        return {"loss": loss, **{k: v.detach() for k, v in parts.items()}}, stats

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, Any]:
        """Held-out Mean@k / pass@k of the current policy (``eval.*`` settings)."""
        return run_evaluation(self.config, self.runtime)

    def _eval_record(self, step: int) -> dict[str, Any]:
        started, cpu_started = time.perf_counter(), time.process_time()
        result = self.evaluate()
        self._release_between_phases()
        k = self.config.eval.k
        if self.config.eval.records:
            from gear_rl.train.evaluate import write_eval_records

            write_eval_records(self.run.path, step, result, k=k, seed=self.config.eval.seed)
        return {"step": step, f"eval/mean@{k}": result[f"mean@{k}"],
                f"eval/pass@{k}": result[f"pass@{k}"],
                "eval/response_len": result["response_len"],
                "eval/truncated": result["truncated"],
                "time/eval": time.perf_counter() - started,
                "time/eval_cpu": time.process_time() - cpu_started,
                **{f"eval/{key}": value for key, value in result.items()
                   if key.startswith(("agent/", "env/"))}}

    # ------------------------------------------------------------------ the loop
    def _release_between_phases(self) -> None:
        """Hand the heap's free pages back to the OS between a step's phases.

        Where the heap keeps its pages for reuse (``runtime.heap_reuse``), only once the
        resident set has outgrown :data:`HEAP_GROWTH` times the process's peak at the end of
        its :data:`HEAP_CEILING_STEP`-th step: until then the next phase's buffers reuse the
        pages in place (a trim had every default-task update page-fault about 580k pages,
        2.3 GB, in again), but freed blocks that later allocations do not fit keep their
        pages, so the resident set creeps up (about 35 MB a step on the default task,
        docs/speed.md), and the trim bounds that."""
        if self.runtime.heap_reuse:
            resident = status_bytes("VmRSS")
            if self._heap_ceiling is None or resident is None or resident <= self._heap_ceiling:
                return
        release_free_memory()

    def _set_heap_ceiling(self) -> None:
        """After this process's :data:`HEAP_CEILING_STEP`-th step: the resident set the phases
        may reach before they trim (:meth:`_release_between_phases`)."""
        self._steps_run += 1
        if self._steps_run == HEAP_CEILING_STEP:
            peak = status_bytes("VmHWM")
            self._heap_ceiling = None if peak is None else HEAP_GROWTH * peak

    def step(self, step: int) -> tuple[dict[str, Any], StepOutput]:
        """One full training step; returns its metrics record and what it computed."""
        timings, started, cpu_started = {}, time.perf_counter(), time.process_time()
        reset_device_peak(self.runtime.device)
        batch = self.rollout(step)
        self._release_between_phases()  # the sampler's KV caches
        timings["time/rollout"] = time.perf_counter() - started
        mark = time.perf_counter()
        fused = self._fused_mode(batch)
        scores = self.score(batch, student=fused is None)
        timings["time/signals"] = time.perf_counter() - mark
        mark = time.perf_counter()
        advantages = None if fused == "inline" else self.credit(batch, scores, step)
        timings["time/credit"] = time.perf_counter() - mark
        mark = time.perf_counter()
        self._release_between_phases()  # the scoring pass's buffers
        update, advantages = self.update(batch, scores, advantages, step, fused=fused)
        self._release_between_phases()  # activations and gradients
        timings["time/update"] = time.perf_counter() - mark
        if "time/credit" in update:  # the inline credit ran inside the update
            timings["time/credit"] = update.pop("time/credit")
            timings["time/update"] -= timings["time/credit"]
        self._set_heap_ceiling()
        timings["time/step"] = time.perf_counter() - started
        # CPU seconds of this process (all its threads): on a shared machine, wall time
        # measures the neighbours too; this is what the step itself cost.
        timings["time/step_cpu"] = time.process_time() - cpu_started
        tokens = sum(len(r) for r in batch.response_ids)
        metrics = batch_metrics(batch, scores, advantages, self.estimator, self.credit_config,
                                self.config.rollout.samples_per_prompt)
        record = {"step": step, **metrics, **update, **timings,
                  "rollout_tok_per_s": tokens / max(timings["time/rollout"], 1e-9),
                  **memory_metrics(self.runtime.device)}
        return record, StepOutput(batch, scores, advantages)

    def samples(self, output: StepOutput, step: int) -> list[dict[str, Any]]:
        """``samples.jsonl`` records of one step (see :func:`records.sample_records`)."""
        return sample_records(output.batch, output.scores, output.advantages, step,
                              estimator=self.estimator, credit_config=self.credit_config,
                              tokenizer=self.tokenizer, task=self.task,
                              count=self.config.log.samples_per_step,
                              samples_per_prompt=self.config.rollout.samples_per_prompt)

    def train(self) -> dict[str, Any]:
        """Run (or continue) the configured number of steps; returns the end summary. The
        sandbox and TensorBoard writer are closed at the end, also when a step fails."""
        try:
            return self._train()
        finally:
            self.close()

    def _train(self) -> dict[str, Any]:
        config = self.config
        started = time.perf_counter()
        k = config.eval.k
        if self.start_step == 0 and config.eval.at_start:
            self._log(self._eval_record(0))
        progress = None
        if config.log.progress:
            from tqdm import tqdm

            progress = tqdm(total=config.steps, initial=self.start_step, desc="train",
                            unit="step", dynamic_ncols=True, file=sys.stderr)
        for step in range(self.start_step + 1, config.steps + 1):
            record, output = self.step(step)
            last = step == config.steps
            if last or (config.eval.every and step % config.eval.every == 0):
                record.update({key: value for key, value in self._eval_record(step).items()
                               if key != "step"})
            self._log(record)
            for sample in self.samples(output, step):
                self.run.append_sample(sample)
            if last or (config.log.checkpoint_every and step % config.log.checkpoint_every == 0):
                save_checkpoint(self.run, step, self.model, self.optimizer,
                                keep=config.log.keep_checkpoints)
            if progress is not None:
                progress.set_postfix(_progress_postfix(record, k))
                progress.update(1)
        if progress is not None:
            progress.close()
        summary = summarize(self.history, k=k, run_dir=str(self.run.path),
                            estimator=config.estimator, model=config.model, task=self.task.name,
                            seconds=time.perf_counter() - started,
                            tensorboard=config.log.tensorboard)
        self.run.write_summary(summary)
        return summary

    def _log(self, record: dict[str, Any]) -> None:
        self.run.append_metrics(record)
        self.history.append(record)
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key.replace("@", "_at_"), value, record["step"])
            self.writer.flush()


def _progress_postfix(record: dict[str, Any], k: int) -> dict[str, str]:
    postfix = {"reward": f"{record['reward_mean']:.3f}", "loss": f"{record['loss']:+.4f}"}
    if f"eval/mean@{k}" in record:
        postfix[f"eval@{k}"] = f"{record[f'eval/mean@{k}']:.3f}"
    for name, label in (("env/success_rate", "solved"), ("agent/tool_call_rate", "tools")):
        if name in record:
            postfix[label] = f"{record[name]:.2f}"
    return postfix


def train(config: TrainConfig, **kwargs: Any) -> dict[str, Any]:
    """Build a :class:`Trainer` for ``config`` and run it; returns the end summary."""
    return Trainer(config, **kwargs).train()

