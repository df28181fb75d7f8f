"""The trainer's runtime for a benchmark, from ``key=value`` overrides (2 threads unless given)."""

from __future__ import annotations

from typing import Any

from gear_rl.train import load_config
from gear_rl.train.runtime import build_runtime


def training_runtime(overrides: list[str]) -> tuple[list[str], Any, Any]:
    """``(overrides as applied, config, runtime)``: ``threads=2`` is added unless a
    ``threads=`` override is given; the runtime is built for training (policy, sampler copy)."""
    if not any(o.startswith("threads=") for o in overrides):
        overrides = ["threads=2", *overrides]
    config = load_config(None, overrides)
    return overrides, config, build_runtime(config, training=True)
