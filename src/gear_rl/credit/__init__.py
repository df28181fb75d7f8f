"""Pure advantage estimators: tensors in, tensors out. No model, no I/O.

One file per method, each citing its paper: ``grpo.py`` (GRPO, Dr.GRPO), ``gear.py`` (GEAR and
its ablations via ``GEARConfig.segmentation``), ``segments.py`` (the scan: compiled kernel and
reference), ``token.py`` (top-entropy mask, RLSD), ``steps/`` (turn/step-level methods for
multi-turn agents: MT-GRPO, GiGPO, GAGPO, Gated-BEPO, GEAR over steps). ``registry.py`` maps
names to estimators that all take a :class:`CreditBatch`: ``ESTIMATORS`` (token signals only)
and ``STEP_ESTIMATORS`` (per-step inputs in ``CreditBatch.extras``).
"""

from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import GEARConfig, OutcomeConfig, RLSDConfig, TopEntropyConfig
from gear_rl.credit.gear import (
    gear_advantages,
    gear_advantages_reference,
    gear_segments,
    gear_weights,
)
from gear_rl.credit.grpo import grpo_advantages
from gear_rl.credit.registry import ESTIMATORS, STEP_ESTIMATORS, Estimator, get_estimator
from gear_rl.credit.steps import (
    STEP_EXTRAS,
    GAGPOConfig,
    GatedBEPOConfig,
    GearStepsConfig,
    GiGPOConfig,
    TurnLevelConfig,
    gagpo_advantages,
    gated_bepo_advantages,
    gear_steps_advantages,
    gigpo_advantages,
    turn_level_advantages,
)
from gear_rl.credit.token import rlsd_advantages, top_entropy_advantages

__all__ = [
    "ESTIMATORS",
    "STEP_ESTIMATORS",
    "STEP_EXTRAS",
    "CreditBatch",
    "Estimator",
    "GAGPOConfig",
    "GEARConfig",
    "GatedBEPOConfig",
    "GearStepsConfig",
    "GiGPOConfig",
    "OutcomeConfig",
    "RLSDConfig",
    "TopEntropyConfig",
    "TurnLevelConfig",
    "gagpo_advantages",
    "gated_bepo_advantages",
    "gear_advantages",
    "gear_advantages_reference",
    "gear_segments",
    "gear_steps_advantages",
    "gear_weights",
    "get_estimator",
    "gigpo_advantages",
    "grpo_advantages",
    "rlsd_advantages",
    "top_entropy_advantages",
    "turn_level_advantages",
]
