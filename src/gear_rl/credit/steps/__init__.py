"""Step-level credit for multi-turn agents: one file per method, each citing its paper.

``turn_level.py`` (MT-GRPO), ``gigpo.py`` (GiGPO), ``gagpo.py`` (GAGPO), ``gated_bepo.py``
(Gated-BEPO), ``gear_steps.py`` (GEAR weights over any of them); ``common.py`` holds the input
checks, returns/GAE helpers, the step -> token broadcast, the registration decorator
(:func:`register_step_estimator`) and the one generic entry point of every per-step method
(:func:`step_advantages`, :func:`per_step_advantages`). Inputs per trajectory (row ``b``): the
outcome ``rewards[b]``, its prompt ``group_ids[b]``, and per step ``k``: the response span
``step_spans[b][k]``, the reward ``step_rewards[b][k]`` and the state key ``state_keys[b][k]``.
Output: ``[B, T]`` token advantages, each step's value on its policy tokens, 0 where
``mask == 0``. Through the registry (``gear_rl.credit.get_estimator``) the per-step inputs come
from ``CreditBatch.extras`` under the keys in :data:`STEP_EXTRAS`.
"""

from gear_rl.credit.steps.common import (
    STEP_EXTRAS,
    StepConfig,
    StepInputs,
    broadcast_steps,
    check_step_inputs,
    per_step_advantages,
    register_step_estimator,
    spans_from_step_ids,
    step_advantages,
)
from gear_rl.credit.steps.gagpo import GAGPOConfig, gagpo_values
from gear_rl.credit.steps.gated_bepo import GatedBEPOConfig, bellman_graph
from gear_rl.credit.steps.gear_steps import (
    GearStepsConfig,
    gear_reweight,
    gear_steps_advantages,
)
from gear_rl.credit.steps.gigpo import GiGPOConfig
from gear_rl.credit.steps.turn_level import TurnLevelConfig

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
    "gagpo_values",
    "gear_reweight",
    "gear_steps_advantages",
    "per_step_advantages",
    "register_step_estimator",
    "spans_from_step_ids",
    "step_advantages",
]
