"""GiGPO: Group-in-Group Policy Optimization.

Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978,
Sec. 3. Two nested groups:

1. **Episode level** (Eq. 2): ``A^E_i = (R_i - mean_g R) / F_norm`` over the prompt group ``g``
   (GRPO), one score per trajectory; here ``R_i = rewards[i]``.
2. **Step level** (Eqs. 3-5): the *anchor-state group* of a state ``s`` collects every step taken
   in ``s`` by any trajectory of the same prompt group (identical state keys; never across
   prompts). Each step carries its discounted return ``G_k = sum_{j >= k} gamma^(j-k) r_j``
   and ``A^S = (G_k - mean_{anchor group} G) / F_norm``.
3. **Combined** (Eq. 6): ``A = A^E + omega * A^S`` on every token of the step.

``F_norm`` is the group's std (``mean_std_norm``) or 1 (``mean_norm``). The paper reports both
variants; verl-agent's example scripts (``examples/gigpo_trainer``) run ALFWorld with
``mean_std_norm`` and WebShop and Sokoban with ``mean_norm``, its ``mode`` setting both levels at
once (see "Episode vs. step normalisation" below).

Choices the paper leaves open, each a knob (``GiGPOConfig``) or stated here:

- **Episode statistics** ``episode_stats``: ``"trajectory"`` (default, the paper's Eq. 2) takes
  the group mean and std over one score per trajectory. ``"per_step"`` reproduces verl-agent's
  ``episode_norm_reward`` as it runs by default (``compute_mean_std_cross_steps=True``): its
  batch holds one row per step, each carrying its trajectory's score, and the statistics run
  over those rows, so each trajectory counts once per step it took (a long trajectory weighs
  more in the baseline than a short one).
- **Prompt groups of one**: a group with a single member (one trajectory; with
  ``per_step``, one step in the whole group) gets ``A^E = 0`` here, as GRPO in this project;
  verl-agent gives it its raw score (mean 0, std 1). With ``per_step`` a single trajectory of
  several steps gets 0 in both (its rows are its own baseline).
- **The episode score**: verl-agent's is the sum of the trajectory's environment rewards; here
  it is the outcome ``rewards[i]``, whatever the step rewards.
- **Singleton anchor groups** (a state no other step of the prompt group visited) have no
  baseline: ``A^S = 0``, so the step falls back to the episode advantage (as verl-agent does).
- **The same state twice in one trajectory**: each visit is its own member of the anchor group
  (with its own return), as in verl-agent; so a loop that revisits a state is compared against
  the visit that left it.
- **Std**: unbiased, ``eps`` added (as GRPO in this project); a constant anchor group gives 0.
- **Episode vs. step normalisation**: ``norm_by_std`` sets the episode level and ``step_norm``
  the step level; the paper's and verl-agent's ``mean_norm`` turns both off
  (``norm_by_std=False, step_norm="mean_norm"``), their ``mean_std_norm`` both on (the defaults).
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

EPISODE_STATS = ("trajectory", "per_step")


@dataclass(frozen=True)
class GiGPOConfig(StepConfig):
    """GiGPO knobs (defaults: ``F_norm`` = std at both levels, one of the paper's two variants
    and verl-agent's ALFWorld script; its WebShop and Sokoban scripts use ``norm_by_std=False,
    step_norm="mean_norm"``).

    Attributes:
        omega: weight of the step-level advantage in ``A^E + omega * A^S`` (``>= 0``).
        step_norm: ``mean_std_norm`` or ``mean_norm`` within an anchor-state group.
        episode_stats: the episode-level group statistics over ``trajectory`` scores (one per
            trajectory, the paper) or ``per_step`` rows (each trajectory's score once per step,
            verl-agent's default).
    """

    omega: float = 1.0
    step_norm: str = "mean_std_norm"
    episode_stats: str = "trajectory"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("omega", self.omega)
        if self.omega < 0:
            raise ValueError(f"omega must be >= 0, got {self.omega}: A^E + omega * A^S with a "
                             "negative omega lowers a step that did better than the other "
                             "steps from its state (0: the episode advantage alone)")
        if self.step_norm not in NORM_MODES:
            raise ValueError(f"step_norm must be one of {NORM_MODES}, got {self.step_norm!r}")
        if self.episode_stats not in EPISODE_STATS:
            raise ValueError(f"episode_stats must be one of {EPISODE_STATS}, "
                             f"got {self.episode_stats!r}")


def episode_advantages(outcomes: torch.Tensor, steps: StepInputs, config: GiGPOConfig
                       ) -> list[float]:
    """``A^E`` per trajectory, with the group statistics ``config.episode_stats`` names."""
    if config.episode_stats == "trajectory":
        return grpo_advantages(outcomes.double(), steps.groups, norm_by_std=config.norm_by_std,
                               eps=config.eps).tolist()
    scores: list[float] = []
    groups: list[int] = []
    first_row: list[int] = []
    for b, spans in enumerate(steps.spans):
        first_row.append(len(scores))
        scores += [float(outcomes[b])] * len(spans)
        groups += [steps.groups[b]] * len(spans)
    rows = group_normalize(scores, groups, "mean_std_norm" if config.norm_by_std else "mean_norm",
                           config.eps)
    # a trajectory without steps has no row and no token to carry an advantage
    return [rows[first_row[b]] if spans else 0.0 for b, spans in enumerate(steps.spans)]


# A^E is 0 in a prompt group of one; A^S need not be (a trajectory that revisits a state
# forms an anchor group of its own visits), so only omega=0 is group-relative
@register_step_estimator("gigpo", config=GiGPOConfig, needs_states=True,
                         group_relative=lambda config: config.omega == 0,
                         paper="arXiv 2505.10978",
                         description="GiGPO: episode advantage + omega * anchor-state "
                                     "step advantage")
def gigpo(outcomes: torch.Tensor, steps: StepInputs, config: GiGPOConfig
          ) -> list[list[float]]:
    """Per-step GiGPO advantages from checked inputs (``steps.state_keys`` must be set)."""
    if steps.state_keys is None:
        raise ValueError("state_keys is required for GiGPO's anchor-state groups")
    episode = episode_advantages(outcomes, steps, config)
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

