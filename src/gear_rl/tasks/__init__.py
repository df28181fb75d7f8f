"""Task sources and rewards: reasoning-gym (default), verl-layout parquet/jsonl datasets with
``math-verify`` checking. ``load_task(spec, ...)`` picks one by name or file suffix."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gear_rl.tasks.answers import extract_answer, last_boxed, last_number
from gear_rl.tasks.base import Problem, Task
from gear_rl.tasks.math_check import math_equal
from gear_rl.tasks.reasoning_gym_task import PRESETS, reasoning_gym_task
from gear_rl.tasks.verl_data import SUFFIXES, load_rows, verl_task

__all__ = [
    "PRESETS",
    "Problem",
    "Task",
    "extract_answer",
    "last_boxed",
    "last_number",
    "load_rows",
    "load_task",
    "math_equal",
    "reasoning_gym_task",
    "verl_task",
]


def load_task(
    spec: str,
    *,
    options: Mapping[str, Any] | None = None,
    train_size: int = 2000,
    eval_size: int = 128,
    seed: int = 0,
    instruction: str = "",
    eval_path: str | None = None,
) -> Task:
    """A task by spec: a ``.parquet`` / ``.jsonl`` / ``.json`` path (verl layout), or a preset
    (``arithmetic``, ``arithmetic-3``, ``products``) / reasoning-gym dataset name, optionally
    prefixed ``rg:``. ``options`` go to reasoning-gym; ``instruction`` is appended to its
    questions; ``eval_path`` is the held-out file for a verl dataset."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task must be a non-empty string, got {spec!r}")
    if spec.endswith(SUFFIXES):
        if options:
            raise ValueError("task_options apply to reasoning-gym tasks, not to dataset files")
        return verl_task(Path(spec), eval_path=eval_path, eval_size=eval_size, seed=seed,
                         train_size=train_size)
    if eval_path is not None:
        raise ValueError("eval_path applies to dataset-file tasks only")
    name = spec.removeprefix("rg:")
    return reasoning_gym_task(name, options=options, train_size=train_size, eval_size=eval_size,
                              seed=seed, instruction=instruction)
