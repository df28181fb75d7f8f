"""GRPO group-normalised outcome advantage, and Dr.GRPO.

GRPO: Shao et al., "DeepSeekMath", arXiv 2402.03300, Sec. 4.1.2 (outcome supervision):
``A_i = (R_i - mean_g) / (std_g + eps)``. Dr.GRPO: Liu et al., "Understanding R1-Zero-Like
Training", arXiv 2503.20783, Sec. 3.2: drop the std division, ``A_i = R_i - mean_g``.

Matches verl's ``compute_grpo_outcome_advantage`` (unbiased std, ``eps`` added to the std) for
groups of two or more. A group of one gets advantage 0 here (verl gives its raw score): a lone
sample has no baseline, so it carries no learning signal (docs/design.md, step 1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import torch

from gear_rl.credit._validate import check_mask, check_vector, group_index
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import OutcomeConfig
from gear_rl.credit.registry import register_estimator


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    *,
    norm_by_std: bool = OutcomeConfig.norm_by_std,
    eps: float = OutcomeConfig.eps,
) -> torch.Tensor:
    """Group-normalised outcome advantage per trajectory.

    Args:
        rewards: ``[B]`` scalar reward per trajectory, finite.
        group_ids: ``B`` hashable prompt ids (or a ``[B]`` integer tensor); trajectories with
            equal ids form a group.
        norm_by_std: divide by the unbiased group std plus ``eps`` (GRPO); ``False`` is Dr.GRPO.
        eps: added to the std, as in verl.

    Returns:
        ``[B]`` advantages in ``rewards``' dtype; 0 for groups of one and zero-variance groups.
    """
    check_vector("rewards", rewards)
    if not (eps >= 0 and eps == eps and eps != float("inf")):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    batch = rewards.shape[0]
    index, num_groups = group_index(group_ids, batch, rewards.device)
    if batch == 0:
        return rewards.clone()

    # Sums in float64: exact enough that a constant group gives exactly 0, whatever its size.
    r64 = rewards.to(torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device)
    count.index_add_(0, index, torch.ones_like(r64))
    total = torch.zeros_like(count).index_add_(0, index, r64)
    mean = total / count
    centred = r64 - mean[index]
    out = centred
    if norm_by_std:
        sq = torch.zeros_like(count).index_add_(0, index, centred * centred)
        std = torch.sqrt(sq / (count - 1).clamp_min(1))
        # a constant group is exactly 0 here, even at eps = 0 (0 / 0 would be NaN)
        out = torch.where(centred == 0, centred, centred / (std[index] + eps))
    out = torch.where(count[index] > 1, out, torch.zeros_like(out))
    return out.to(rewards.dtype)


class Outcomes(Protocol):
    """What :func:`outcome_advantages` reads: a :class:`CreditBatch`, or the trainer's batch
    before any signal exists."""

    @property
    def rewards(self) -> torch.Tensor: ...

    @property
    def group_ids(self) -> Sequence[Hashable] | torch.Tensor: ...


def outcome_advantages(batch: Outcomes, config: OutcomeConfig) -> torch.Tensor:
    """``[B]`` trajectory advantages of ``batch`` with ``config``'s ``norm_by_std`` and ``eps``:
    the scalar every token-level method in this package starts from."""
    return grpo_advantages(batch.rewards, batch.group_ids, norm_by_std=config.norm_by_std,
                           eps=config.eps)


@register_estimator("grpo", config=OutcomeConfig, fixed={"norm_by_std": True},
                    group_relative=True, paper="arXiv 2402.03300",
                    description="GRPO: group-normalised outcome advantage on every token")
@register_estimator("dr_grpo", config=OutcomeConfig, fixed={"norm_by_std": False},
                    group_relative=True, paper="arXiv 2503.20783",
                    description="Dr.GRPO: group-centred outcome advantage, no std division")
def broadcast_outcome(batch: CreditBatch, config: OutcomeConfig) -> torch.Tensor:
    """``[B, T]``: the trajectory advantage on each of its policy tokens, 0 elsewhere."""
    check_mask(batch.mask)
    advantages = outcome_advantages(batch, config)
    return advantages[:, None] * batch.mask.to(advantages.dtype)
