"""Pure advantage estimators: tensors in, tensors out. No model, no I/O.

One file per method, each citing its paper and registering itself with
:func:`register_estimator`: ``grpo.py`` (GRPO, Dr.GRPO), ``gear.py`` (GEAR and its ablations),
``token.py`` (top-entropy mask, RLSD), ``opsd.py`` (self-distillation alone), ``mc.py``
(Monte-Carlo segment credit: SPO-chain, VinePPO), ``steps/``
(turn/step-level methods for multi-turn agents: MT-GRPO, GiGPO, GAGPO, Gated-BEPO, GEAR over
steps). ``segments.py`` is GEAR's scan (compiled kernel and reference), ``diagnostics.py`` the
credit health numbers every engine logs, ``registry.py`` the name -> :class:`Estimator` map
(:data:`ESTIMATORS`, :func:`get_estimator`, :func:`load_plugins`). Every estimator takes a
:class:`CreditBatch` and its config and returns ``[B, T]`` token-level advantages.
"""

from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import GEARConfig, OutcomeConfig, RLSDConfig, TopEntropyConfig
from gear_rl.credit.diagnostics import credit_diagnostics
from gear_rl.credit.gear import (
    gear_advantages,
    gear_advantages_reference,
    gear_segments,
    gear_signed_advantages,
    gear_weights,
)
from gear_rl.credit.grpo import grpo_advantages, outcome_advantages
from gear_rl.credit.mc import SPOChainConfig, VinePPOConfig
from gear_rl.credit.opsd import OPSDConfig
from gear_rl.credit.registry import (
    ENTRY_POINT_GROUP,
    ESTIMATORS,
    SIGNAL_FIELDS,
    Estimator,
    estimator_names,
    get_estimator,
    load_plugins,
    register_estimator,
)
from gear_rl.credit.steps import (
    STEP_EXTRAS,
    GAGPOConfig,
    GatedBEPOConfig,
    GearStepsConfig,
    GiGPOConfig,
    TurnLevelConfig,
    gear_steps_advantages,
    per_step_advantages,
    register_step_estimator,
    step_advantages,
)
from gear_rl.credit.token import rlsd_advantages, top_entropy_advantages

__all__ = [
    "ENTRY_POINT_GROUP",
    "ESTIMATORS",
    "SIGNAL_FIELDS",
    "STEP_EXTRAS",
    "CreditBatch",
    "Estimator",
    "GAGPOConfig",
    "GEARConfig",
    "GatedBEPOConfig",
    "GearStepsConfig",
    "GiGPOConfig",
    "OPSDConfig",
    "OutcomeConfig",
    "RLSDConfig",
    "SPOChainConfig",
    "TopEntropyConfig",
    "TurnLevelConfig",
    "VinePPOConfig",
    "credit_diagnostics",
    "estimator_names",
    "gear_advantages",
    "gear_advantages_reference",
    "gear_segments",
    "gear_signed_advantages",
    "gear_steps_advantages",
    "gear_weights",
    "get_estimator",
    "grpo_advantages",
    "load_plugins",
    "outcome_advantages",
    "per_step_advantages",
    "register_estimator",
    "register_step_estimator",
    "rlsd_advantages",
    "step_advantages",
    "top_entropy_advantages",
]
