"""Datasets in verl's layout: parquet or jsonl rows with a chat ``prompt``,
``reward_model.ground_truth`` and ``data_source`` (how verl's GSM8K / MATH preprocessing writes
them). Answers are checked with ``math-verify`` (see ``gear_rl.tasks.math_check``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gear_rl.tasks.answers import extract_answer
from gear_rl.tasks.base import Problem, Task, split_train_eval
from gear_rl.tasks.math_check import math_equal

__all__ = ["load_rows", "verl_task"]

SUFFIXES = (".parquet", ".jsonl", ".json")


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` (via pyarrow), ``.jsonl`` (one object per line) or ``.json`` (a
    list of objects) file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        with path.open() as handle:
            return [json.loads(line) for line in handle if line.strip()]
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows")
        return rows
    raise ValueError(f"dataset file {str(path)!r} must end in one of {SUFFIXES}")


def row_problem(row: Mapping[str, Any], index: int, split: str) -> Problem:
    """One verl row as a :class:`Problem`. The teacher's reference is the row's solution when it
    has one (``extra_info.solution`` / ``reward_model.solution``), else the ground truth."""
    where = f"{split} row {index}"
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if (not isinstance(prompt, list) or not prompt
            or not all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)):
        raise ValueError(f"{where}: 'prompt' must be a list of {{'role', 'content'}} messages")
    reward_model = row.get("reward_model") or {}
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"{where}: needs 'reward_model': {{'ground_truth': ...}}")
    ground_truth = reward_model["ground_truth"]
    if isinstance(ground_truth, (list, tuple)):
        ground_truth = ground_truth[0]
    extra = row.get("extra_info") or {}
    solution = (extra.get("solution") if isinstance(extra, Mapping) else None) or reward_model.get(
        "solution")
    uid = extra.get("index", index) if isinstance(extra, Mapping) else index
    return Problem(
        id=f"{split}/{uid}",
        prompt=[{"role": str(m["role"]), "content": str(m["content"])} for m in prompt],
        answer=str(ground_truth),
        reference=str(solution) if solution else str(ground_truth),
        reference_kind="solution" if solution else "answer",
        data_source=str(row.get("data_source", "")),
    )


def verl_task(
    train_path: str | Path,
    *,
    eval_path: str | Path | None = None,
    eval_size: int = 128,
    seed: int = 0,
    train_size: int | None = None,
) -> Task:
    """A task from verl-layout files, scored with ``math-verify``.

    Args:
        train_path: training rows.
        eval_path: held-out rows; None holds out ``eval_size`` rows of ``train_path``, chosen by
            ``seed``, and trains on the rest.
        eval_size: held-out rows to keep (the first ``eval_size`` of ``eval_path``).
        seed: the hold-out split's shuffle seed.
        train_size: keep at most this many training rows (None: all).
    """
    train_rows = load_rows(train_path)
    problems = [row_problem(row, i, "train") for i, row in enumerate(train_rows)]
    held_out = None
    if eval_path is not None:
        eval_rows = load_rows(eval_path)[:eval_size]
        held_out = [row_problem(row, i, "eval") for i, row in enumerate(eval_rows)]
    problems, held_out = split_train_eval(problems, held_out, eval_size=eval_size, seed=seed,
                                          train_size=train_size, source=str(train_path))

    def scorer(problem: Problem, response: str) -> float:
        return float(math_equal(problem.answer, response))

    return Task(name=f"verl:{train_path}", train=problems, eval=held_out, scorer=scorer,
                extract=extract_answer)
