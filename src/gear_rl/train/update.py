"""Step 4 of :meth:`gear_rl.train.trainer.Trainer.step`: the update engine.

:class:`UpdateEngine` runs ``loss.epochs`` x ``loss.minibatches`` AdamW steps: it packs each
mini-batch into micro-batches (:meth:`UpdateEngine.micro_batches`), runs each one's forward
with gradients (the :class:`~gear_rl.train.scoring.SignalPass`), its loss (PPO's clipped
surrogate, + KL to the initial policy, + self-distillation) and backward, then clips, steps
and checks that the weights are finite.

Fused scoring (:class:`~gear_rl.train.scoring.Fusion`, decided by :meth:`UpdateEngine.fusion`)
lets the forward stand in for the no-grad scoring pass: it fills the batch's
:class:`~gear_rl.train.scoring.Scores`, and under ``Fusion.INLINE`` the credit runs on each
micro-batch between its forward and its backward. The credit reaches the engine as a
:class:`Credit`, a tensor or a function of the scores: the engine never calls back into the
trainer.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from gear_rl.credit import Estimator
from gear_rl.seeding import derive_seed
from gear_rl.signals import backbone_tokens
from gear_rl.train.config import TrainConfig
from gear_rl.train.loss import aggregate, kl_penalty, ppo_policy_loss
from gear_rl.train.mfu import ModelShape, pass_flops
from gear_rl.train.scoring import Fusion, Scores, SignalPass, StepBatch

__all__ = ["Credit", "NonFiniteTrainingError", "UpdateEngine", "UpdateResult", "adamw",
           "credit_function"]


class NonFiniteTrainingError(RuntimeError):
    """A NaN or inf reached the loss, the gradients or the weights: the run stops before that
    step's checkpoint, so the last checkpoint on disk is still a good one."""


def adamw(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW, fused where the parameters' device supports it (CPU and CUDA do): one kernel
    over all parameters, no foreach temporaries (on SmolLM2-135M on CPU about 2.5x faster a
    step than foreach, with 0.5 GB less peak memory)."""
    options: dict[str, Any] = {"lr": config.optim.lr,
                               "betas": (config.optim.beta1, config.optim.beta2),
                               "eps": config.optim.eps, "weight_decay": config.optim.weight_decay}
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **options)
    except RuntimeError:  # a device without the fused kernel
        return torch.optim.AdamW(model.parameters(), **options)


@dataclass
class Credit:
    """The credit phase's hand-off to the update.

    Attributes:
        advantages: ``[B, T]`` advantages, computed before the update; None under
            ``Fusion.INLINE`` until the update has run.
        compute: under ``Fusion.INLINE``, the estimator as a function of the filled
            :class:`Scores` (``[B, T]``); the engine calls it after each micro-batch's forward
            and keeps that micro-batch's rows (a row-local estimator's rows do not read the
            rows still unfilled, and a single micro-batch fills every row).
        seconds: wall time spent in ``compute`` (the update adds to it).
    """

    advantages: torch.Tensor | None = None
    compute: Callable[[Scores], torch.Tensor] | None = None
    seconds: float = 0.0


@dataclass
class UpdateResult:
    """What the update did: its metrics (``loss``, ``pg_loss``, ``kl_loss``, ``opsd_loss``,
    ``grad_norm``: means over its AdamW steps; ``clip_frac``, ``approx_kl``: over its policy
    tokens; ``ratio_max``, ``lr``), the ``[B, T]`` advantages it trained on, and its model
    FLOPs (:mod:`gear_rl.train.mfu`; None where the engine has no model shape)."""

    metrics: dict[str, float]
    advantages: torch.Tensor
    flops: float | None = None


class UpdateEngine:
    """The PPO-style update of a policy on a scored batch.

    Args:
        model: the policy. optimizer: its AdamW (:func:`adamw`).
        config: the run's :class:`TrainConfig` (``loss.*``, ``optim.*``, ``seed``,
            ``rollout.max_new_tokens`` for the ``seq-mean-token-sum-norm`` horizon).
        estimator, credit_config: the credit estimator (update-time token selection, whether
            the reward enters the loss, whether it self-distils).
        signals: the policy's :class:`SignalPass` (the forward with gradients).
        reference_kl: a reference model's log-probs are in the scores (``loss.kl_coef > 0``).
        opsd_weight: the self-distillation term's weight (``LossConfig.opsd_weight``).
        autocast: the run's autocast context. last_checkpoint: the newest checkpoint on disk
            (named in the non-finite error), or None.
        shape: the policy's :class:`~gear_rl.train.mfu.ModelShape`, for the update's model
            FLOPs (:attr:`UpdateResult.flops`); None: not counted.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 config: TrainConfig, estimator: Estimator, credit_config: Any,
                 signals: SignalPass, *, reference_kl: bool, opsd_weight: float,
                 autocast: Callable[[], contextlib.AbstractContextManager],
                 last_checkpoint: Callable[[], Any], shape: ModelShape | None = None) -> None:
        self.model, self.optimizer, self.config = model, optimizer, config
        self.estimator, self.credit_config, self.signals = estimator, credit_config, signals
        self.reference_kl, self.opsd_weight = reference_kl, opsd_weight
        self.autocast, self.last_checkpoint = autocast, last_checkpoint
        self.shape = shape

    # ------------------------------------------------------------------ decisions
    def lr(self, step: int) -> float:
        """The learning rate of ``step`` (1-based): linear warm-up over ``optim.warmup_steps``."""
        warmup = self.config.optim.warmup_steps
        scale = min(1.0, step / warmup) if warmup > 0 else 1.0
        return self.config.optim.lr * scale

    def fusion(self, batch: StepBatch) -> Fusion | None:
        """How the update may stand in for the scoring pass (``loss.fuse_scoring``).

        Only on-policy single updates qualify (``loss.epochs=1``, ``loss.minibatches=1``):
        the policy that is updated is then the one whose log-probs the scoring pass would
        compute, so PPO's old log-probs are the update forward's own, detached (ratio 1; TRL
        does the same). :attr:`Fusion.BEFORE` when the estimator reads no student signal,
        :attr:`Fusion.INLINE` when it does and either the batch packs into one micro-batch or
        the estimator is ``row_local`` (GEAR, RLSD), None otherwise (the scoring pass runs;
        always for a Monte-Carlo estimator that reads the student's signals, since its values
        phase needs them before the update: SPO-chain's cuts)."""
        loss = self.config.loss
        if not loss.fuse_scoring or loss.epochs != 1 or loss.minibatches != 1:
            return None
        reads_student = bool({"divergence", "entropy", "student_logprobs"}
                             & set(self.estimator.needs))
        if not reads_student:
            return Fusion.BEFORE
        if self.estimator.mc_boundaries is not None:
            return None  # the values phase reads the student's signals before the update
        if self.estimator.row_local or len(
                self.micro_batches(batch, list(range(len(batch.response_ids))))) == 1:
            return Fusion.INLINE
        return None

    def micro_batches(self, batch: StepBatch, minibatch: list[int]) -> list[list[int]]:
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

    # ------------------------------------------------------------------ the update
    def run(self, batch: StepBatch, scores: Scores, credit: Credit, step: int, *,
            forward_context: Callable[[], contextlib.AbstractContextManager]
            = contextlib.nullcontext) -> UpdateResult:
        """``loss.epochs`` x ``loss.minibatches`` AdamW steps on ``batch``.

        ``forward_context``: what each gradient forward runs in (the memory policy's layer
        trims, :meth:`gear_rl.train.memory.MemoryPolicy.update`). Under fused scoring
        (``scores.fusion``) each forward fills ``scores``; under ``Fusion.INLINE`` the credit
        (``credit.compute``) then runs before the backward."""
        config = self.config.loss
        rows = len(batch.response_ids)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr(step)
        totals = {"loss": 0.0, "pg_loss": 0.0, "kl_loss": 0.0, "opsd_loss": 0.0,
                  "clipped": 0.0, "approx_kl": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        ratio_max, updates = 1.0, 0
        self._flops = 0.0
        shuffle = torch.Generator().manual_seed(derive_seed(self.config.seed, 2, step))
        try:
            for _ in range(config.epochs):
                order = torch.randperm(rows, generator=shuffle).tolist()
                for split in np.array_split(np.array(order), config.minibatches):
                    minibatch: list[int] = sorted(split.tolist())
                    ratio_max = self._minibatch(batch, scores, credit, step, minibatch,
                                                totals, forward_context, ratio_max)
                    updates += 1
        finally:
            # the gradients are not read again before the next update's zero_grad: free them
            # now, so that the rollout, evaluation and checkpoint do not hold a model's worth
            # of memory
            self.optimizer.zero_grad(set_to_none=True)
        tokens = max(totals.pop("tokens"), 1.0)
        out = {name: value / updates for name, value in totals.items()
               if name not in ("clipped", "approx_kl")}
        out["clip_frac"] = totals["clipped"] / tokens
        out["approx_kl"] = totals["approx_kl"] / tokens
        out["ratio_max"] = ratio_max
        out["lr"] = self.lr(step)
        # the credit phase or the inline credit above set the advantages
        return UpdateResult(out, cast(torch.Tensor, credit.advantages),
                            None if self.shape is None else self._flops)

    def _minibatch(self, batch: StepBatch, scores: Scores, credit: Credit, step: int,
                   minibatch: list[int], totals: dict[str, float],
                   forward_context: Callable[[], contextlib.AbstractContextManager],
                   ratio_max: float) -> float:
        """One AdamW step over ``minibatch``'s micro-batches (gradient accumulation); adds to
        ``totals`` and returns the running ``ratio_max``."""
        num_tokens = float(scores.mask[minibatch].sum())
        micros = self.micro_batches(batch, minibatch)
        # an estimator that selects tokens per micro-batch (update_mask) fixes how many from
        # the masks alone: the policy loss's token mean divides by their total
        counts = [self.estimator.update_token_count(scores.mask[micro], self.credit_config)
                  for micro in micros]
        num_selected = None if None in counts else float(sum(cast(list[float], counts)))
        self.optimizer.zero_grad(set_to_none=True)
        for micro in micros:
            teacher = scores.fusion is Fusion.INLINE
            with forward_context():
                forward = self.forward(batch, micro, teacher=teacher,
                                       teacher_rows=scores.teacher_rows)
            self._flops += self.forward_flops(batch, micro, teacher=teacher,
                                              teacher_rows=scores.teacher_rows)
            if scores.fusion is not None:
                scores.fill(micro, forward)
            if credit.compute is not None:
                _inline_credit(credit, scores, micro)
            parts, stats = self._micro_loss(scores, cast(torch.Tensor, credit.advantages),
                                            micro, forward, len(minibatch), num_tokens,
                                            num_selected)
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
        return ratio_max

    def forward(self, batch: StepBatch, rows: list[int], *, teacher: bool = False,
                teacher_rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The update's forward over the micro-batch ``rows``, with gradients through the
        student's log-probs: ``logprobs``, ``entropy`` (``[M, T_m]``; no loss term
        differentiates it, so it is computed without gradients), and, for self-distillation
        or when ``teacher`` (the inline credit needs them), the teacher pass's
        ``divergence`` and ``teacher_logprobs`` (on the rows ``teacher_rows`` marks)."""
        prompts = [batch.prompt_ids[i] for i in rows]
        responses = [batch.response_ids[i] for i in rows]
        teachers = [batch.teacher_ids[i] for i in rows]
        with self.autocast():
            if self.signals.distill or teacher:
                return self.signals(prompts, teachers, responses, batch.masks(rows),
                                    teacher_rows=None if teacher_rows is None
                                    else teacher_rows[rows], requires_grad=True)
            own = self.signals(prompts, None, responses, batch.masks(rows),
                               requires_grad=True)
        return {"logprobs": own["logprobs"], "entropy": own["entropy"]}

    def forward_flops(self, batch: StepBatch, rows: list[int], *, teacher: bool = False,
                      teacher_rows: torch.Tensor | None = None) -> float:
        """Model FLOPs of :meth:`forward` on ``rows`` and its backward
        (:func:`~gear_rl.train.mfu.pass_flops`): the student's pass with gradients, plus the
        teacher's no-grad pass over the taught rows where the forward runs it; 0 without a
        model shape."""
        if self.shape is None:
            return 0.0
        prompts = [batch.prompt_ids[i] for i in rows]
        responses = [batch.response_ids[i] for i in rows]
        share = self.signals.share_prompts and len({tuple(p) for p in prompts}) < len(prompts)
        flops = pass_flops(self.shape, prompts, responses, gradients=True, share_prompts=share)
        if self.signals.distill or teacher:
            taught = [i for i in rows if teacher_rows is None or bool(teacher_rows[i])]
            flops += pass_flops(self.shape, [batch.teacher_ids[i] for i in taught],
                                [batch.response_ids[i] for i in taught], gradients=False,
                                share_prompts=share)
        return flops

    def _micro_loss(self, scores: Scores, advantages: torch.Tensor, rows: list[int],
                    forward: dict[str, torch.Tensor], num_seqs: int, num_tokens: float,
                    num_selected: float | None = None) -> tuple[dict[str, torch.Tensor], Any]:
        """Loss of the micro-batch ``rows`` (its :meth:`forward` outputs ``forward``) scaled
        so micro-batches sum to the mini-batch loss.

        Where the estimator selects tokens at update time (``update_mask``, e.g. top-entropy
        with ``selection=micro_batch``), the policy loss keeps only the tokens it selects by
        the current policy's entropy, and its token mean divides by ``num_selected`` (their
        count over the mini-batch); the KL and self-distillation terms keep every policy
        token. Under fused scoring the old log-probs are the forward's own, detached.

        Returns ``({"loss", "pg_loss", "kl_loss", "opsd_loss"}, PolicyLossStats | None)``.
        """
        config = self.config
        logprobs, entropy = forward["logprobs"], forward["entropy"]
        divergence = forward.get("divergence") if self.signals.distill else None
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
            old = (logprobs.detach() if scores.fusion is not None
                   else cast(torch.Tensor, scores.old_logprobs)[rows, :length])
            parts["pg_loss"], stats = ppo_policy_loss(
                logprobs, old, advantages[rows, :length],
                pg_mask, clip_low=config.loss.clip_low, clip_high=config.loss.clip_high,
                **pg_agg)
        if self.reference_kl:
            # the scoring pass fills ref_logprobs whenever there is a reference model
            ref_logprobs = cast(torch.Tensor, scores.ref_logprobs)
            kl = kl_penalty(logprobs, ref_logprobs[rows, :length], config.loss.kl_type)
            parts["kl_loss"] = aggregate(kl, mask, agg["agg_mode"], num_seqs=num_seqs,
                                         num_tokens=num_tokens, horizon=agg["horizon"])
        if divergence is not None:
            parts["opsd_loss"] = aggregate(divergence.float(), mask, agg["agg_mode"],
                                           num_seqs=num_seqs, num_tokens=num_tokens,
                                           horizon=agg["horizon"])
        loss = (parts["pg_loss"] + config.loss.kl_coef * parts["kl_loss"]
                + self.opsd_weight * parts["opsd_loss"])
        return {"loss": loss, **{k: v.detach() for k, v in parts.items()}}, stats

    # ------------------------------------------------------------------ checks
    def _check_finite(self, step: int, what: str, value: torch.Tensor) -> None:
        """Stop the run (no checkpoint of this step) when ``value`` is NaN or inf."""
        if bool(torch.isfinite(value).all()):
            return
        last = self.last_checkpoint()
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


def credit_function(estimator: Estimator, credit_config: Any, batch: StepBatch,
                    step: int | None) -> Callable[[Scores], torch.Tensor]:
    """The estimator as a function of ``batch``'s scores: ``[B, T]`` float32 advantages.
    ``step`` (1-based) reaches estimators with a schedule as ``CreditBatch.step`` (RLSD's
    ``lam`` decay); the update applies any update-time token selection itself."""
    def compute(scores: Scores) -> torch.Tensor:
        credit_batch = scores.credit_batch(batch)
        credit_batch.step = step
        credit_batch.applies_update_mask = True  # _micro_loss applies the selection
        return estimator(credit_batch, credit_config).float()

    return compute


def _inline_credit(credit: Credit, scores: Scores, rows: list[int]) -> None:
    """The inline credit of the micro-batch ``rows``, now that their signals are in."""
    mark = time.perf_counter()
    advantages = cast(Callable[[Scores], torch.Tensor], credit.compute)(scores)
    if credit.advantages is None:
        credit.advantages = advantages
    else:
        credit.advantages[rows] = advantages[rows]
    credit.seconds += time.perf_counter() - mark
