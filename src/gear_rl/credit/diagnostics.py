"""Credit health numbers, one set of names for every engine (the trainer, TRL, verl).

GEAR (arXiv 2605.11853) rescales GRPO's trajectory advantage ``A`` by a per-token weight
``W``; whether a run sits in the regime where ``W`` redistributes credit or only rescales it
per sign shows in the mean ``W`` per advantage sign and in how much of the response is inside
segments (docs/design.md, "GEAR"). These are computed here once:

- ``adv_abs_mean``: mean ``|Ahat|`` over policy tokens.
- ``weight_mean_pos`` / ``weight_mean_neg``: mean ``W = Ahat / A`` over the policy tokens of
  trajectories with ``A > 0`` / ``A < 0`` (absent when no such token, or when the estimator
  does not use the reward).
- ``divergence_mean``: mean divergence over policy tokens (when the batch has it).
- ``segment_frac``: fraction of policy tokens inside a segment; ``segments_per_response``:
  segment onsets per trajectory (estimators that declare ``segments``).

Where the teacher pass ran on some rows only (the trainer's ``signals.teacher_rows``), the last
three cover those rows.

The trainer logs the names as they are; TRL and verl log them under ``gear/``.
"""

from __future__ import annotations

from typing import Any

import torch

from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.gear import gear_segments
from gear_rl.credit.grpo import outcome_advantages
from gear_rl.credit.registry import Estimator

DIAGNOSTIC_NAMES: tuple[str, ...] = ("adv_abs_mean", "weight_mean_pos", "weight_mean_neg",
                                     "divergence_mean", "segment_frac", "segments_per_response")


def token_weights(outcome: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
                  ) -> torch.Tensor:
    """``[B, T]`` ``W = Ahat / A`` (0 where ``A = 0`` or ``mask = 0``).

    Args:
        outcome: ``[B]`` trajectory advantages ``A``.
        advantages: ``[B, T]`` token advantages ``Ahat``.
        mask: ``[B, T]`` policy-token mask.
    """
    outcome = outcome.to(advantages.dtype)
    safe = torch.where(outcome == 0, torch.ones_like(outcome), outcome)
    keep = (outcome != 0)[:, None] & (mask > 0)
    return torch.where(keep, advantages / safe[:, None], torch.zeros_like(advantages))


def credit_diagnostics(estimator: Estimator, config: Any, batch: CreditBatch,
                       advantages: torch.Tensor,
                       outcome: torch.Tensor | None = None,
                       teacher_rows: torch.Tensor | None = None) -> dict[str, float]:
    """The health numbers of ``advantages`` (``[B, T]``, what ``estimator(batch, config)``
    returned) on ``batch``.

    Args:
        estimator: the registered estimator that produced ``advantages``.
        config: its config.
        batch: the :class:`CreditBatch` it ran on.
        advantages: ``[B, T]`` token advantages.
        outcome: ``[B]`` trajectory advantages the weights are relative to (``None``: GRPO's
            with the config's ``norm_by_std``/``eps``, or GRPO's defaults when the config has
            none). TRL passes its own group-normalised advantages here.
        teacher_rows: ``[B]`` bool, the rows whose divergence the teacher computed (None:
            every row); the divergence and segment numbers cover those rows only.

    Returns:
        A dict with the names of :data:`DIAGNOSTIC_NAMES` that apply to this batch.
    """
    mask = batch.mask.to(advantages.device)
    on = mask > 0
    tokens = on.sum().clamp(min=1)
    out: dict[str, float] = {"adv_abs_mean": float(advantages.abs()[on].sum() / tokens)}
    if estimator.uses_reward:
        if outcome is None:
            outcome = reference_outcome(batch, config)
        outcome = outcome.to(advantages.device)
        weights = token_weights(outcome, advantages.double(), mask)
        for sign, name in ((1, "weight_mean_pos"), (-1, "weight_mean_neg")):
            rows = (outcome * sign > 0)[:, None] & on
            if bool(rows.any()):
                out[name] = float(weights[rows].mean())
    if batch.divergence is None or (teacher_rows is not None and not bool(teacher_rows.any())):
        return out
    taught = on if teacher_rows is None else on & teacher_rows.to(on.device)[:, None]
    taught_tokens = taught.sum().clamp(min=1)
    out["divergence_mean"] = float(batch.divergence.double()[taught].sum() / taught_tokens)
    if estimator.segments and batch.entropy is not None:
        onsets = gear_segments(batch.divergence, batch.entropy, batch.mask, config)
        inside = (onsets >= 0) & taught
        out["segment_frac"] = float(inside.sum() / taught_tokens)
        starts = onsets == torch.arange(onsets.shape[1], device=onsets.device)
        responses = on.shape[0] if teacher_rows is None else int(teacher_rows.sum())
        out["segments_per_response"] = float((starts & taught).sum() / max(1, responses))
    return out


def reference_outcome(batch: CreditBatch, config: Any) -> torch.Tensor:
    """``[B]`` the trajectory advantage token weights are measured against: GRPO's with the
    config's ``norm_by_std``/``eps``, or GRPO's defaults when the config has none."""
    if hasattr(config, "norm_by_std") and hasattr(config, "eps"):
        return outcome_advantages(batch, config)
    from gear_rl.credit.config import OutcomeConfig

    return outcome_advantages(batch, OutcomeConfig())
