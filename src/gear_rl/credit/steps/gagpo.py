"""GAGPO: Generalized Advantage Grouped Policy Optimization.

Zhu et al., "GAGPO: Generalized Advantage Grouped Policy Optimization", arXiv 2605.13217,
Sec. 3. Critic-free TD/GAE credit over a non-parametric value proxy:

1. **Grouping.** Steps of the trajectories of one prompt group that acted in identical states
   (equal state keys) form a state group; never across prompts.
2. **Grouped value proxy.** ``V(s) = mean of G_k`` over the steps ``k`` in the state group of
   ``s``, with ``G_k = sum_{j >= k} gamma^(j-k) r_j`` the step's discounted return.
3. **TD residuals** along each trajectory: ``delta_k = r_k + gamma * V(s_{k+1}) - V(s_k)``, with
   ``V = 0`` after the last step.
4. **GAE**: ``A_k = sum_{j >= k} (gamma * lam)^(j-k) delta_{j}``.
5. **Group normalisation** of ``A`` over every step of the prompt group.

Not implemented: the paper's **action-level importance ratio**. The paper trains with a
group-normalised PPO update whose importance ratio is taken per action (a step's whole turn), not
per token. This project's policy loss (``gear_rl.train``) keeps its per-token ratio for every
estimator, so ``gagpo`` here is GAGPO's advantage estimator under a token-level PPO/GRPO update,
not the paper's full objective.

Choices the paper leaves open (knobs of :class:`GAGPOConfig`, or stated here):

- ``lam`` and ``gamma`` defaults (0.95 / 0.95) are this project's, the usual GAE values.
- **Normalisation unit** ``adv_norm``: ``mean_std_norm`` (default; unbiased std plus ``eps``),
  ``mean_norm`` (centre only) or ``none``, over all steps of the prompt group, each step counting
  once (a long trajectory weighs more than a short one). A prompt group with a single step, or
  constant advantages, gets 0.
- A state seen once has ``V(s) = G_k`` of that one step; with ``lam = 1`` GAE telescopes to
  ``A_k = G_k - V(s_k)``, so such a step gets 0 before normalisation.
- Revisits of a state within one trajectory each contribute their own return to ``V(s)``.
- Returns and the outcome: see :mod:`gear_rl.credit.steps.common` (``outcome_in_returns``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from gear_rl.credit.config import _finite
from gear_rl.credit.steps.common import (
    NORM_MODES,
    StepConfig,
    StepInputs,
    discounted_returns,
    gae,
    group_normalize,
    register_step_estimator,
)

ADV_NORM_MODES = (*NORM_MODES, "none")


@dataclass(frozen=True)
class GAGPOConfig(StepConfig):
    """GAGPO knobs.

    Attributes:
        lam: GAE ``lambda`` in ``[0, 1]`` (0: one-step TD residuals; 1: return minus proxy).
        adv_norm: ``mean_std_norm``, ``mean_norm`` or ``none`` over the prompt group's steps.
    """

    lam: float = 0.95
    adv_norm: str = "mean_std_norm"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("lam", self.lam)
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.adv_norm not in ADV_NORM_MODES:
            raise ValueError(f"adv_norm must be one of {ADV_NORM_MODES}, got {self.adv_norm!r}")


def gagpo_values(steps: StepInputs, stream: list[list[float]], gamma: float
                 ) -> list[list[float]]:
    """``V(s_k)`` per step: the mean discounted return of the step's state group."""
    if steps.state_keys is None:
        raise ValueError("state_keys is required for GAGPO's state groups")
    totals: dict[tuple[int, Hashable], list[float]] = {}
    returns = [discounted_returns(rewards, gamma) for rewards in stream]
    for b, row in enumerate(returns):
        for k, g in enumerate(row):
            totals.setdefault((steps.groups[b], steps.state_keys[b][k]), []).append(g)
    means = {key: sum(v) / len(v) for key, v in totals.items()}
    return [[means[(steps.groups[b], key)] for key in keys]
            for b, keys in enumerate(steps.state_keys)]


@register_step_estimator("gagpo", config=GAGPOConfig, needs_states=True,
                         paper="arXiv 2605.13217",
                         description="GAGPO: GAE over a grouped state-value proxy, "
                                     "group-normalised")
def gagpo(outcomes: torch.Tensor, steps: StepInputs, config: GAGPOConfig
          ) -> list[list[float]]:
    """Per-step GAGPO advantages from checked inputs (``steps.state_keys`` must be set)."""
    stream = steps.returns_rewards(outcomes.tolist(), config.outcome_in_returns)
    values = gagpo_values(steps, stream, config.gamma)
    flat, keys, where = [], [], []
    for b, (rewards, v) in enumerate(zip(stream, values, strict=True)):
        deltas = [r + config.gamma * (v[k + 1] if k + 1 < len(v) else 0.0) - v[k]
                  for k, r in enumerate(rewards)]
        for k, a in enumerate(gae(deltas, config.gamma, config.lam)):
            flat.append(a)
            keys.append(steps.groups[b])
            where.append((b, k))
    normalized = group_normalize(flat, keys, config.adv_norm, config.eps)
    out = [[0.0] * len(r) for r in stream]
    for (b, k), a in zip(where, normalized, strict=True):
        out[b][k] = a
    return out

