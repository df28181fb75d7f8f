"""vLLM-CPU as verl's rollout server: keep the linear layers' weights as parameters.

A ``vllm.general_plugins`` entry point of gear-rl (vLLM loads it in every vLLM process). It acts
only where both hold: verl's ``VERL_PLATFORM=cpu`` is set (gear-rl's CPU mode,
``gear_rl.integrations.verl.cpu``) and vLLM runs on its CPU platform. Anywhere else it changes
nothing.

Why: vllm-cpu 0.27.1 packs every unquantised linear weight into a oneDNN (or sgl-kernel) handle
after loading and replaces the parameter with an empty one
(``vllm/model_executor/layers/linear.py:220``, ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=True)`` in ``vllm/model_executor/layers/utils.py``). verl updates the rollout's
weights every step through each parameter's ``weight_loader``, which the empty parameter lacks
(``'Parameter' object has no attribute 'weight_loader'``), and the job then hangs. The
embedding/LM head keeps its parameter there, but its packed handle would go on computing with the
first step's weights. So in CPU mode every 2-D weight stays the live parameter and is applied
with ``torch.nn.functional.linear``, which reads whatever verl loaded last. Other layers (3-D MoE
and conv weights, meta tensors) go through vLLM's own dispatch.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from gear_rl.integrations.cpu_mode import cpu_mode_requested

logger = logging.getLogger(__name__)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def keep_weights(original: Any) -> Any:
    """``dispatch_cpu_unquantized_gemm`` that keeps 2-D weights as parameters (module doc)."""

    @functools.wraps(original)
    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = _linear  # type: ignore[assignment]
        return None

    dispatch._gear_rl_keeps_weights = True  # type: ignore[attr-defined]
    return dispatch


def active() -> bool:
    """gear-rl's CPU mode asked for (``VERL_PLATFORM=cpu``) and vLLM on its CPU platform."""
    if not cpu_mode_requested():
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def register() -> None:
    """The entry point: install :func:`keep_weights` where :func:`active`; idempotent."""
    if not active():
        return
    from vllm.model_executor.layers import utils

    if getattr(utils.dispatch_cpu_unquantized_gemm, "_gear_rl_keeps_weights", False):
        return
    utils.dispatch_cpu_unquantized_gemm = keep_weights(utils.dispatch_cpu_unquantized_gemm)
    logger.info("gear-rl: vLLM-CPU linear layers keep their weights (verl weight sync)")
