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

from dataclasses import dataclass

import torch

from gear_rl.credit.config import _finite
from gear_rl.credit.grpo import grpo_advantages
from gear_rl.credit.steps.common import (
    NORM_MODES,
    StepConfig,
    StepInputs,
    discounted_returns,
    group_normalize,
    register_step_estimator,
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


@register_step_estimator("gigpo", config=GiGPOConfig, needs_states=True,
                         paper="arXiv 2505.10978",
                         description="GiGPO: episode advantage + omega * anchor-state "
                                     "step advantage")
def gigpo(outcomes: torch.Tensor, steps: StepInputs, config: GiGPOConfig
          ) -> list[list[float]]:
    """Per-step GiGPO advantages from checked inputs (``steps.state_keys`` must be set)."""
    if steps.state_keys is None:
        raise ValueError("state_keys is required for GiGPO's anchor-state groups")
    episode = grpo_advantages(outcomes.double(), steps.groups, norm_by_std=config.norm_by_std,
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

