"""Task sources and rewards: reasoning-gym (default), verl-layout parquet/jsonl datasets with
``math-verify`` checking, tool-integrated math, function calling (ToolRL files, BFCL) and
multi-turn text games. ``load_task(spec, ...)`` picks one by name, prefix or file suffix."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gear_rl.tasks.agentic import ENV_NAMES, env_task, tool_math_task
from gear_rl.tasks.answers import extract_answer, last_boxed, last_number
from gear_rl.tasks.base import (
    DEFAULT_EVAL_SIZE,
    DEFAULT_TRAIN_SIZE,
    AgentSpec,
    EnvSpec,
    Problem,
    Task,
    check_prompt_lengths,
)
from gear_rl.tasks.math_check import is_blank_answer, math_equal
from gear_rl.tasks.reasoning_gym_task import PRESETS, reasoning_gym_task
from gear_rl.tasks.verl_data import SUFFIXES, load_rows, verl_task

__all__ = [
    "DEFAULT_EVAL_SIZE",
    "DEFAULT_TRAIN_SIZE",
    "ENV_NAMES",
    "PRESETS",
    "AgentSpec",
    "EnvSpec",
    "Problem",
    "Task",
    "check_prompt_lengths",
    "env_task",
    "extract_answer",
    "is_blank_answer",
    "last_boxed",
    "last_number",
    "load_rows",
    "load_task",
    "math_equal",
    "reasoning_gym_task",
    "tool_math_task",
    "verl_task",
]


def load_task(
    spec: str,
    *,
    options: Mapping[str, Any] | None = None,
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    instruction: str = "",
    eval_path: str | None = None,
) -> Task:
    """A task by spec.

    - a ``.parquet`` / ``.jsonl`` / ``.json`` path: verl layout (``eval_path``: its held-out
      file);
    - a preset (``arithmetic``, ``arithmetic-3``, ``products``) or reasoning-gym dataset name,
      optionally prefixed ``rg:`` (``options`` go to reasoning-gym, ``instruction`` is appended
      to its questions);
    - ``tool-math`` or ``tool-math:NAME``: reasoning-gym math with a Python tool (default
      problems: products of two 2-digit numbers), multi-turn;
    - ``toolrl:PATH``: a ToolRL-layout file (function calling, scored from the response text);
    - ``bfcl`` or ``bfcl:simple,multiple,parallel``: BFCL categories (function calling; the
      episode ends at the first ``<tool_call>`` block);
    - ``sokoban`` / ``keydoor``: multi-turn text games (``options``: the environment's config);
    - ``textarena:NAME``: a single-player TextArena grid game (``FrozenLake-v0`` and its
      variants, ``Sokoban-v0``; the list and why others are left out:
      :mod:`gear_rl.envs.textarena`). ``options``: ``max_steps``, ``invalid_action_penalty``.
      Needs the ``envs`` extra. TextArena draws a Sokoban level in about 0.1 s, so
      ``Sokoban-v0`` with the default training size (:data:`DEFAULT_TRAIN_SIZE` levels) takes
      minutes to load.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task must be a non-empty string, got {spec!r}")
    name, _, arg = spec.partition(":")
    if name in ("tool-math", "bfcl", *ENV_NAMES) and eval_path is not None:
        raise ValueError(f"eval_data applies to dataset-file tasks only, not {name!r}")
    if name == "tool-math":
        return tool_math_task(arg or None, options=options, train_size=train_size,
                              eval_size=eval_size, seed=seed, instruction=instruction)
    if name in ("toolrl", "bfcl", *ENV_NAMES) and instruction:
        raise ValueError(f"instruction applies to reasoning-gym tasks, not {name!r}")
    if name == "toolrl":
        if not arg:
            raise ValueError("task toolrl needs a file: toolrl:PATH")
        if options:
            raise ValueError("task_options do not apply to toolrl")
        from gear_rl.tasks.toolrl import toolrl_task

        return toolrl_task(arg, eval_path=eval_path, eval_size=eval_size, seed=seed,
                           train_size=train_size)
    if name == "bfcl":
        if options:
            raise ValueError("task_options do not apply to bfcl")
        from gear_rl.tasks.bfcl import bfcl_task

        categories = tuple(c.strip() for c in arg.split(",") if c.strip()) if arg else (
            "simple", "multiple", "parallel")
        return bfcl_task(categories, eval_size=eval_size, seed=seed, train_size=train_size)
    if name in ENV_NAMES:
        opts = dict(options or {})
        turns = opts.pop("max_turns", None)
        return env_task(spec, options=opts, max_turns=turns, train_size=train_size,
                        eval_size=eval_size, seed=seed)
    if spec.endswith(SUFFIXES):
        if options:
            raise ValueError("task_options apply to reasoning-gym tasks, not to dataset files")
        return verl_task(Path(spec), eval_path=eval_path, eval_size=eval_size, seed=seed,
                         train_size=train_size)
    if eval_path is not None:
        raise ValueError(f"eval_data applies to dataset-file tasks only, not {name!r}")
    name = spec.removeprefix("rg:")
    return reasoning_gym_task(name, options=options, train_size=train_size, eval_size=eval_size,
                              seed=seed, instruction=instruction)
