"""Step-level credit for multi-turn agents: one file per method, each citing its paper.

``turn_level.py`` (MT-GRPO), ``gigpo.py`` (GiGPO), ``gagpo.py`` (GAGPO), ``gated_bepo.py``
(Gated-BEPO), ``gear_steps.py`` (GEAR weights over any of them); ``common.py`` holds the input
checks, returns/GAE helpers and the step -> token broadcast. Inputs per trajectory (row ``b``):
the outcome ``rewards[b]``, its prompt ``group_ids[b]``, and per step ``k``: the response span
``step_spans[b][k]``, the reward ``step_rewards[b][k]`` and the state key ``state_keys[b][k]``.
Output: ``[B, T]`` token advantages, each step's value on its policy tokens, 0 where
``mask == 0``. The registry (``gear_rl.credit.get_estimator``) reads the per-step inputs from
``CreditBatch.extras`` under the keys in :data:`STEP_EXTRAS`.
"""

from gear_rl.credit.steps.common import (
    STEP_EXTRAS,
    StepConfig,
    StepInputs,
    broadcast_steps,
    check_step_inputs,
    spans_from_step_ids,
)
from gear_rl.credit.steps.gagpo import GAGPOConfig, gagpo_advantages, gagpo_step_advantages
from gear_rl.credit.steps.gated_bepo import (
    GatedBEPOConfig,
    bellman_graph,
    gated_bepo_advantages,
    gated_bepo_step_advantages,
)
from gear_rl.credit.steps.gear_steps import GearStepsConfig, gear_reweight, gear_steps_advantages
from gear_rl.credit.steps.gigpo import GiGPOConfig, gigpo_advantages, gigpo_step_advantages
from gear_rl.credit.steps.turn_level import (
    TurnLevelConfig,
    turn_level_advantages,
    turn_level_step_advantages,
)

__all__ = [
    "STEP_EXTRAS",
    "GAGPOConfig",
    "GatedBEPOConfig",
    "GearStepsConfig",
    "GiGPOConfig",
    "StepConfig",
    "StepInputs",
    "TurnLevelConfig",
    "bellman_graph",
    "broadcast_steps",
    "check_step_inputs",
    "gagpo_advantages",
    "gagpo_step_advantages",
    "gated_bepo_advantages",
    "gated_bepo_step_advantages",
    "gear_reweight",
    "gear_steps_advantages",
    "gigpo_advantages",
    "gigpo_step_advantages",
    "spans_from_step_ids",
    "turn_level_advantages",
    "turn_level_step_advantages",
]
