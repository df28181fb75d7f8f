"""Pure advantage estimators: tensors in, tensors out. No model, no I/O.

One file per method, each citing its paper: ``grpo.py`` (GRPO, Dr.GRPO), ``gear.py`` (GEAR and
its ablations via ``GEARConfig.segmentation``), ``segments.py`` (the scan: compiled kernel and
reference), ``token.py`` (top-entropy mask, RLSD). ``registry.py`` maps names to estimators that
all take a :class:`CreditBatch`.
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
from gear_rl.credit.registry import ESTIMATORS, Estimator, get_estimator
from gear_rl.credit.token import rlsd_advantages, top_entropy_advantages

__all__ = [
    "ESTIMATORS",
    "CreditBatch",
    "Estimator",
    "GEARConfig",
    "OutcomeConfig",
    "RLSDConfig",
    "TopEntropyConfig",
    "gear_advantages",
    "gear_advantages_reference",
    "gear_segments",
    "gear_weights",
    "get_estimator",
    "grpo_advantages",
    "rlsd_advantages",
    "top_entropy_advantages",
]
