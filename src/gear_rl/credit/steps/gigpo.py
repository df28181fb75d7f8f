"""GiGPO: Group-in-Group Policy Optimization.

Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978,
Sec. 3. Two nested groups:

1. **Episode level** (Eq. 2): ``A^E_i = (R_i - mean_g R) / F_norm`` over the prompt group ``g``
   (GRPO); here ``R_i = rewards[i]``.
2. **Step level** (Eqs. 3-5): the *anchor-state group* of a state ``s`` collects every step taken
   in ``s`` by any trajectory of the same prompt group (identical state keys; never across
   prompts). Each step carries its discounted return ``G_k = sum_{j >= k} gamma^(j-k) r_j``
   and ``A^S = (G_k - mean_{anchor group} G) / F_norm``.
3. **Combined** (Eq. 6): ``A = A^E + omega * A^S`` on every token of the step.

``F_norm`` is the group's std (``mean_std_norm``) or 1 (``mean_norm``).

Choices the paper leaves open, each a knob (``GiGPOConfig``) or stated here:

- **Singleton anchor groups** (a state no other step of the prompt group visited) have no
  baseline: ``A^S = 0``, so the step falls back to the episode advantage (as verl-agent does).
- **The same state twice in one trajectory**: each visit is its own member of the anchor group
  (with its own return), as in verl-agent; so a loop that revisits a state is compared against
  the visit that left it.
- **Std**: unbiased, ``eps`` added (as GRPO in this project); a constant anchor group gives 0.
- **Episode vs. step normalisation**: ``norm_by_std`` sets the episode level and ``step_norm``
  the step level; the paper's ``mean_norm`` variant is both off (``norm_by_std=False,
  step_norm="mean_norm"``).
- **Returns and the outcome**: see :mod:`gear_rl.credit.steps.common` (``outcome_in_returns``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from gear_rl.credit.config import _finite
from gear_rl.credit.grpo import grpo_advantages
from gear_rl.credit.steps.common import (
    NORM_MODES,
    StepConfig,
    StepInputs,
    broadcast_steps,
    checked_method_inputs,
    discounted_returns,
    group_normalize,
    output_dtype,
)


@dataclass(frozen=True)
class GiGPOConfig(StepConfig):
    """GiGPO knobs (defaults: the paper's ALFWorld/WebShop setting).

    Attributes:
        omega: weight of the step-level advantage in ``A^E + omega * A^S``.
        step_norm: ``mean_std_norm`` or ``mean_norm`` within an anchor-state group.
    """

    omega: float = 1.0
    step_norm: str = "mean_std_norm"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("omega", self.omega)
        if self.step_norm not in NORM_MODES:
            raise ValueError(f"step_norm must be one of {NORM_MODES}, got {self.step_norm!r}")


def gigpo_step_advantages_from_inputs(outcomes: torch.Tensor, steps: StepInputs,
                                      group_ids: Sequence[Hashable] | torch.Tensor,
                                      config: GiGPOConfig) -> list[list[float]]:
    """Per-step GiGPO advantages from checked inputs (``steps.state_keys`` must be set)."""
    if steps.state_keys is None:
        raise ValueError("state_keys is required for GiGPO's anchor-state groups")
    episode = grpo_advantages(outcomes.double(), group_ids, norm_by_std=config.norm_by_std,
                              eps=config.eps).tolist()
    stream = steps.returns_rewards(outcomes.tolist(), config.outcome_in_returns)
    returns, anchors, where = [], [], []
    for b, rewards in enumerate(stream):
        for k, g in enumerate(discounted_returns(rewards, config.gamma)):
            returns.append(g)
            anchors.append((steps.groups[b], steps.state_keys[b][k]))
            where.append((b, k))
    step_adv = group_normalize(returns, anchors, config.step_norm, config.eps)
    out = [[0.0] * len(r) for r in stream]
    for (b, k), a_step in zip(where, step_adv, strict=True):
        out[b][k] = episode[b] + config.omega * a_step
    return out


def _checked(rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor,
             mask: torch.Tensor, step_spans: Sequence[Sequence[tuple[int, int]]],
             state_keys: Sequence[Sequence[Hashable]],
             step_rewards: Sequence[Sequence[float]] | None, config: GiGPOConfig
             ) -> tuple[StepInputs, list[list[float]]]:
    steps = checked_method_inputs(config, GiGPOConfig, rewards, mask, group_ids, step_spans,
                                  step_rewards, state_keys, require_states=True)
    return steps, gigpo_step_advantages_from_inputs(rewards, steps, group_ids, config)


def gigpo_step_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    mask: torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    state_keys: Sequence[Sequence[Hashable]],
    step_rewards: Sequence[Sequence[float]] | None = None,
    config: GiGPOConfig = GiGPOConfig(),
) -> list[list[float]]:
    """Per-step GiGPO advantages ``A^E + omega * A^S``: ``B`` lists, one float per step (args
    as in :func:`gigpo_advantages`)."""
    return _checked(rewards, group_ids, mask, step_spans, state_keys, step_rewards, config)[1]


def gigpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    mask: torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    state_keys: Sequence[Sequence[Hashable]],
    step_rewards: Sequence[Sequence[float]] | None = None,
    config: GiGPOConfig = GiGPOConfig(),
) -> torch.Tensor:
    """GiGPO token-level advantages.

    Args:
        rewards: ``[B]`` episode reward per trajectory.
        group_ids: ``B`` hashable prompt ids, or a ``[B]`` integer tensor.
        mask: ``[B, T]`` 1 on policy tokens, 0 on padding and observations.
        step_spans: ``B`` lists of ``(start, end)`` response positions of each step.
        state_keys: ``B`` lists of hashable keys of the state each step acted in.
        step_rewards: ``B`` lists of per-step rewards (``None``: all zeros).
        config: the knobs.

    Returns:
        ``[B, T]`` advantages (float64 if ``rewards`` is, else float32), 0 where ``mask == 0``.
    """
    steps, per_step = _checked(rewards, group_ids, mask, step_spans, state_keys, step_rewards,
                               config)
    return broadcast_steps(per_step, steps.spans, mask, output_dtype(rewards))
