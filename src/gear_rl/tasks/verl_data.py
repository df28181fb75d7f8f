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
from gear_rl.tasks.base import (
    DEFAULT_EVAL_SIZE,
    Problem,
    Task,
    split_train_eval,
    unique_problem_ids,
)
from gear_rl.tasks.math_check import math_equal

__all__ = ["file_problems", "load_rows", "located_rows", "row_problem", "verl_task"]

SUFFIXES = (".parquet", ".jsonl", ".json")
REQUIRED_COLUMNS = ("prompt", "reward_model")


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` (via pyarrow), ``.jsonl`` (one object per line) or ``.json`` (a
    list of objects) file. A row that is not an object, text that is not JSON and bytes that are
    not UTF-8 raise a ``ValueError`` naming the file and the line (see :func:`located_rows`)."""
    return [row for _, row in located_rows(path)]


def located_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The rows of :func:`load_rows`, each with its place in the file for error messages:
    ``"PATH line N"`` for jsonl (the 1-based line, blank lines counted) and ``"PATH row N"``
    (1-based) for parquet and json."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        return [(f"{path} row {number}", row)
                for number, row in enumerate(_parquet_rows(path), 1)]
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".json":
        rows = _parse_json(path.read_bytes(), str(path), 0)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows")
        return [(f"{path} row {number}", _object_row(row, f"{path} row {number}"))
                for number, row in enumerate(rows, 1)]
    raise ValueError(f"dataset file {str(path)!r} must end in one of {SUFFIXES}")


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: not a readable parquet file ({reason})") from exc
    return table.to_pylist()


_BLANK = object()  # what _parse_json returns for a blank line
_BOM = b"\xef\xbb\xbf"


def _jsonl_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows: list[tuple[str, dict[str, Any]]] = []
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path} line {number}"
            row = _parse_json(raw, where, offset)
            offset += len(raw)
            if row is not _BLANK:
                rows.append((where, _object_row(row, where)))
    return rows


def _parse_json(data: bytes, where: str, offset: int) -> Any:
    """``data`` (bytes starting at byte ``offset`` of the file; a UTF-8 byte-order mark at the
    file's start is skipped) as JSON; ``_BLANK`` when it is only whitespace."""
    if offset == 0 and data.startswith(_BOM):
        data, offset = data[len(_BOM):], len(_BOM)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 text (byte {offset + exc.start} of the file); "
                         "re-encode the file as UTF-8") from exc
    if not text.strip():
        return _BLANK
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if "\n" not in text.strip() else (
            f"line {exc.lineno} column {exc.colno}")
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at {at})") from exc


def _object_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object ({{\"prompt\": ..., ...}}), "
                         f"got {type(row).__name__}")
    return row


def row_problem(row: Mapping[str, Any], index: int, split: str, where: str = "") -> Problem:
    """One verl row as a :class:`Problem`. The teacher's reference is the row's solution when it
    has one (``extra_info.solution`` / ``reward_model.solution``), else the ground truth.

    ``index`` is the row's 0-based position, its id when ``extra_info.index`` is absent;
    ``where`` names the row in errors (default ``"SPLIT row INDEX"``). An empty ground truth
    (``""``, whitespace, ``[]``) is refused: the checker's number fallback would read it as 0.
    """
    where = where or f"{split} row {index}"
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
        ground_truth = ground_truth[0] if ground_truth else ""
    if ground_truth is None or not str(ground_truth).strip():
        raise ValueError(f"{where}: 'reward_model.ground_truth' is empty "
                         f"({reward_model['ground_truth']!r}); give the reference answer or drop "
                         "the row")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, Mapping):
        extra = {}
    solution = extra.get("solution") or reward_model.get("solution")
    solution = str(solution) if solution is not None and str(solution).strip() else None
    uid = extra.get("index")
    return Problem(
        id=f"{split}/{index if uid is None else uid}",
        prompt=[{"role": str(m["role"]), "content": str(m["content"])} for m in prompt],
        answer=str(ground_truth),
        reference=solution or str(ground_truth),
        reference_kind="solution" if solution else "answer",
        data_source=str(row.get("data_source", "")),
    )


def file_problems(path: str | Path, split: str, *, limit: int | None = None) -> list[Problem]:
    """The problems of a verl-layout file (its first ``limit`` rows; None: all), with ids unique
    within the file (see :func:`~gear_rl.tasks.base.unique_problem_ids`)."""
    located = located_rows(path)
    _check_columns(located, path)
    problems = [row_problem(row, index, split, where)
                for index, (where, row) in enumerate(located[:limit])]
    return unique_problem_ids(problems, split=split, source=str(path))


def _check_columns(located: list[tuple[str, dict[str, Any]]], path: str | Path) -> None:
    """A column no row has is a file-level error (a parquet written without it), named once."""
    if not located:
        return
    for column in REQUIRED_COLUMNS:
        if not any(column in row for _, row in located):
            columns = sorted({key for _, row in located for key in row})
            raise ValueError(f"{path}: no {column!r} column (it has {columns}); a verl-layout "
                             "file needs 'prompt' (chat messages) and 'reward_model' with "
                             "'ground_truth'")
    if not any(isinstance(row.get("reward_model"), Mapping) and "ground_truth" in row[
            "reward_model"] for _, row in located):
        raise ValueError(f"{path}: no 'reward_model.ground_truth' column; a verl-layout file "
                         "keeps each row's reference answer there")


def verl_task(
    train_path: str | Path,
    *,
    eval_path: str | Path | None = None,
    eval_size: int = DEFAULT_EVAL_SIZE,
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
    problems = file_problems(train_path, "train")
    held_out = None if eval_path is None else file_problems(eval_path, "eval", limit=eval_size)
    problems, held_out = split_train_eval(problems, held_out, eval_size=eval_size, seed=seed,
                                          train_size=train_size, source=str(train_path))

    def scorer(problem: Problem, response: str) -> float:
        return float(math_equal(problem.answer, response))

    return Task(name=f"verl:{train_path}", train=problems, eval=held_out, scorer=scorer,
                extract=extract_answer)
