"""Turn-level credit assignment: MT-GRPO.

Zeng et al., "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment",
arXiv 2505.11821, Sec. 4 (MT-GRPO). The paper has two turns (a tool call, then the answer) and
gives the tokens of the first turn ``A^T_i + lambda * A^O_i`` and those of the final turn
``A^O_i``, where ``A^T`` is the group-normalised turn reward and ``A^O`` the group-normalised
outcome reward (GRPO over the prompt group).

Choices the paper leaves open, each a knob of :class:`TurnLevelConfig`:

- **More than two turns.** Turn ``k`` of trajectory ``i`` is normalised against turn ``k`` of
  the other trajectories of the same prompt group that reached turn ``k`` (the "turn group");
  every non-final turn gets ``A^T_{i,k} + outcome_coef * A^O_i``. A turn group of one gets
  ``A^T = 0``.
- **The final turn** gets ``A^O_i`` alone (``last_turn="outcome"``, the paper) or the same
  combination as every other turn (``"combined"``).
- **Turn normalisation** ``turn_norm``: ``mean_std_norm`` (the paper: like GRPO) or
  ``mean_norm`` (centre only). The outcome advantage follows ``norm_by_std`` (GRPO/Dr.GRPO).
- The turn reward is the turn's own reward ``step_rewards[i][k]`` (not a return-to-go), as in
  the paper, where a turn reward scores the turn itself (e.g. "the tool call ran").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gear_rl.credit.config import OutcomeConfig, _finite
from gear_rl.credit.grpo import grpo_advantages
from gear_rl.credit.steps.common import (
    NORM_MODES,
    StepInputs,
    group_normalize,
    register_step_estimator,
)

LAST_TURN_MODES = ("outcome", "combined")


@dataclass(frozen=True)
class TurnLevelConfig(OutcomeConfig):
    """MT-GRPO knobs.

    Attributes:
        outcome_coef: ``lambda``, the weight of the outcome advantage added to each turn's
            advantage (the paper uses 1; ``>= 0``).
        turn_norm: ``mean_std_norm`` or ``mean_norm`` for the turn rewards within a turn group.
        last_turn: ``outcome`` (the final turn gets ``A^O`` only, the paper) or ``combined``.
    """

    outcome_coef: float = 1.0
    turn_norm: str = "mean_std_norm"
    last_turn: str = "outcome"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("outcome_coef", self.outcome_coef)
        if self.outcome_coef < 0:
            raise ValueError(f"outcome_coef must be >= 0, got {self.outcome_coef}: A^T + "
                             "outcome_coef * A^O with a negative weight pushes the turns of a "
                             "failed episode up and those of a successful one down")
        if self.turn_norm not in NORM_MODES:
            raise ValueError(f"turn_norm must be one of {NORM_MODES}, got {self.turn_norm!r}")
        if self.last_turn not in LAST_TURN_MODES:
            raise ValueError(f"last_turn must be one of {LAST_TURN_MODES}, "
                             f"got {self.last_turn!r}")


# group-relative: a turn group of one gets A^T = 0, and a prompt group of one A^O = 0
@register_step_estimator("turn_level", config=TurnLevelConfig, needs_states=False,
                         group_relative=True, paper="arXiv 2505.11821",
                         description="MT-GRPO: group-normalised turn rewards + outcome")
def turn_level(outcomes: torch.Tensor, steps: StepInputs, config: TurnLevelConfig
               ) -> list[list[float]]:
    """Per-step MT-GRPO advantages from checked inputs (the public entry point is
    ``step_advantages("turn_level", ...)``)."""
    outcome_adv = grpo_advantages(outcomes.double(), steps.groups, norm_by_std=config.norm_by_std,
                                  eps=config.eps).tolist()
    flat_values, flat_keys, where = [], [], []
    for b, rewards in enumerate(steps.rewards):
        for k, r in enumerate(rewards):
            flat_values.append(r)
            flat_keys.append((steps.groups[b], k))
            where.append((b, k))
    turn_adv = group_normalize(flat_values, flat_keys, config.turn_norm, config.eps)
    out = [[0.0] * len(r) for r in steps.rewards]
    for (b, k), a_turn in zip(where, turn_adv, strict=True):
        last = k == len(steps.rewards[b]) - 1
        if last and config.last_turn == "outcome":
            out[b][k] = outcome_adv[b]
        else:
            out[b][k] = a_turn + config.outcome_coef * outcome_adv[b]
    return out

