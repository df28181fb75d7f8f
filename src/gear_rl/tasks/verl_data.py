"""Datasets in verl's layout: parquet or jsonl rows with a chat ``prompt``,
``reward_model.ground_truth`` and ``data_source`` (how verl's GSM8K / MATH preprocessing writes
them). Answers are checked with ``math-verify`` (see ``gear_rl.tasks.math_check``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from gear_rl.dataclass_config import check_file
from gear_rl.safe_json import loads_bounded
from gear_rl.tasks.answers import extract_answer
from gear_rl.tasks.base import (
    DEFAULT_EVAL_SIZE,
    Located,
    Problem,
    Task,
    distinct_problems,
    split_train_eval,
)
from gear_rl.tasks.math_check import math_equal

__all__ = ["chat_prompt", "file_problems", "gold_answer", "load_rows", "located_problems",
           "located_rows", "row_problem", "verl_task"]

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
    path = check_file(path, "dataset file")  # missing, or a directory, a FIFO...: say which
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
        return loads_bounded(text)
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if "\n" not in text.strip() else (
            f"line {exc.lineno} column {exc.colno}")
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at {at})") from exc
    except ValueError as exc:  # nested past the bound
        raise ValueError(f"{where}: not usable JSON ({exc})") from exc


def _object_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object ({{\"prompt\": ..., ...}}), "
                         f"got {type(row).__name__}")
    return row


def _plain(value: Any) -> Any:
    """A numpy array or scalar (how verl hands over a parquet value) as Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def _type_of(value: Any) -> str:
    """``value``'s type and a short repr, for errors: ``"bytes (b'2')"``."""
    return f"{type(value).__name__} ({value!r:.80})"


def _number_text(value: Any) -> str:
    """A finite int, float or Decimal as positional decimal text: ``72.0`` -> ``"72"``,
    ``1e-07`` -> ``"0.0000001"`` (math-verify would read ``1e-07`` as ``1 * e - 7``)."""
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if not math.isfinite(value):
        raise ValueError(f"is not a finite number ({value!r}); give the reference answer")
    text = format(Decimal(value if isinstance(value, Decimal) else repr(value)).normalize(), "f")
    return "0" if text == "-0" else text


def gold_answer(value: Any) -> str:
    """A row's ``reward_model.ground_truth`` as the gold answer text the checker compares with
    (the rules of docs/data.md):

    - a string: as is; blank text is refused (the number fallback would read it as 0);
    - an int, or a finite float or Decimal: its positional decimal text (``72.0`` -> ``"72"``,
      ``1e-07`` -> ``"0.0000001"``); NaN and infinities are refused;
    - a list (or numpy array) of one such value: that value; an empty list, a list of several
      answers (the checker compares with one) and a list inside a list are refused;
    - anything else is refused: ``None``, bools, dicts, bytes (a parquet binary column: write
      the column as strings).

    Raises:
        ValueError: saying what the value is and what to write instead; the caller prefixes
            the file, row and field.
    """
    value = _plain(value)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("is an empty list; give the reference answer")
        if len(value) > 1:
            raise ValueError(f"is a list of {len(value)} answers ({value!r:.80}); the checker "
                             "compares with one: keep one answer per row")
        value = _plain(value[0])
        if isinstance(value, (list, tuple)):
            raise ValueError(f"is a list inside a list ({value!r:.80}); give one answer")
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"is blank ({value!r}); give the reference answer or drop the row")
        return value
    if isinstance(value, (numbers.Integral, float, Decimal)) and not isinstance(value, bool):
        return _number_text(value)
    if isinstance(value, (bytes, bytearray)):
        raise ValueError(f"is bytes ({value!r:.80}), a binary column; write the column as "
                         "strings (e.g. pyarrow.string())")
    raise ValueError(f"must be a string, a number or a one-element list of one, got "
                     f"{_type_of(value)}")


def chat_prompt(value: Any, where: str) -> list[dict[str, str]]:
    """A row's ``prompt`` as chat messages (the rules of docs/data.md): a string is one user
    message; a list holds ``{"role", "content"}`` objects whose role is a non-empty string and
    whose content is a string (``null``, list-form content and other types are refused, never
    rendered as text); at least one message is a ``user`` message and no user message is blank.
    Keys other than ``role`` and ``content`` are dropped.

    Raises:
        ValueError: naming ``where`` (the file and row) and the field (``prompt[1].content``).
    """
    value = _plain(value)
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{where}: 'prompt' is blank ({value!r}); give the question or "
                             "drop the row")
        value = [{"role": "user", "content": value}]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where}: 'prompt' must be a string or a non-empty list of "
                         f"{{'role', 'content'}} messages, got {_type_of(value)}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ValueError(f"{where}: 'prompt[{i}]' must be a {{'role', 'content'}} message, "
                             f"got {_type_of(message)}")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not role.strip():
            raise ValueError(f"{where}: 'prompt[{i}].role' must be a non-empty string such as "
                             f"'user' or 'system', got {_type_of(role)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}: 'prompt[{i}].content' must be a string, got "
                             f"{_type_of(content)}; write the message's text as one string")
        if role == "user" and not content.strip():
            raise ValueError(f"{where}: 'prompt[{i}].content' is a blank user message; give "
                             "the question or drop the row")
        messages.append({"role": role, "content": content})
    if not any(message["role"] == "user" for message in messages):
        raise ValueError(f"{where}: 'prompt' has no user message (roles: "
                         f"{[m['role'] for m in messages]}); put the question in a "
                         "{'role': 'user', 'content': ...} message")
    return messages


def _solution(extra: Mapping[str, Any], reward_model: Mapping[str, Any], where: str) -> str | None:
    """The first non-blank of ``extra_info.solution`` and ``reward_model.solution`` (None when
    both are absent, null or blank); a value that is not a string is refused."""
    for field_name, holder in (("extra_info", extra), ("reward_model", reward_model)):
        solution = _plain(holder.get("solution"))
        if solution is None:
            continue
        if not isinstance(solution, str):
            raise ValueError(f"{where}: '{field_name}.solution' must be a string, got "
                             f"{_type_of(solution)}; write the worked solution as text or "
                             "leave it out")
        if solution.strip():
            return solution
    return None


def row_problem(row: Mapping[str, Any], index: int, split: str, where: str = "") -> Problem:
    """One verl row as a :class:`Problem`. The teacher's reference is the row's solution when it
    has one (``extra_info.solution`` / ``reward_model.solution``), else the ground truth.

    ``index`` is the row's 0-based position, its id when ``extra_info.index`` is absent;
    ``where`` names the row in errors (default ``"SPLIT row INDEX"``). The prompt follows
    :func:`chat_prompt` and the ground truth :func:`gold_answer`; a value either refuses is a
    ``ValueError`` naming ``where`` and the field.
    """
    where = where or f"{split} row {index}"
    prompt = chat_prompt(row.get("prompt"), where)
    reward_model = _plain(row.get("reward_model"))
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"{where}: needs 'reward_model': {{'ground_truth': ...}}")
    try:
        answer = gold_answer(reward_model["ground_truth"])
    except ValueError as exc:
        raise ValueError(f"{where}: 'reward_model.ground_truth' {exc}") from None
    extra = _plain(row.get("extra_info"))
    if extra is None:
        extra = {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"{where}: 'extra_info' must be an object ({{'index': ..., "
                         f"'solution': ...}}) or absent, got {_type_of(extra)}")
    solution = _solution(extra, reward_model, where)
    uid = extra.get("index")
    data_source = row.get("data_source")
    return Problem(
        id=f"{split}/{index if uid is None else uid}",
        prompt=prompt,
        answer=answer,
        reference=solution or answer,
        reference_kind="solution" if solution else "answer",
        data_source="" if data_source is None else str(data_source),
    )


def file_problems(path: str | Path, split: str, *, limit: int | None = None) -> list[Problem]:
    """The distinct problems of a verl-layout file (its first ``limit``; None: all), with ids
    unique within the file (see :func:`located_problems`)."""
    return [problem for _, problem in located_problems(path, split, limit=limit)]


def located_problems(path: str | Path, split: str, *, limit: int | None = None) -> list[Located]:
    """The problems of :func:`file_problems`, each with its place in the file: a row whose
    prompt repeats an earlier row's is left out with a warning
    (:func:`~gear_rl.tasks.base.distinct_problems`)."""
    located = located_rows(path)
    _check_columns(located, path)
    return distinct_problems(((where, row_problem(row, index, split, where))
                              for index, (where, row) in enumerate(located)),
                             split=split, source=str(path), limit=limit)


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
        eval_path: held-out rows; None holds out ``eval_size`` problems of ``train_path``,
            chosen by ``seed``, and trains on the rest.
        eval_size: held-out problems to keep (the first ``eval_size`` distinct ones of
            ``eval_path``).
        seed: the hold-out split's shuffle seed.
        train_size: keep at most this many training problems (None: all).

    A problem is its prompt: rows that repeat an earlier row's prompt are left out, and
    training rows with a held-out prompt too, each with a warning, so no held-out problem is
    trained on (:func:`~gear_rl.tasks.base.split_train_eval`).
    """
    located = located_problems(train_path, "train")
    located_held_out = None if eval_path is None else located_problems(eval_path, "eval",
                                                                       limit=eval_size)
    problems, held_out = split_train_eval(located, located_held_out, eval_size=eval_size,
                                          seed=seed, train_size=train_size,
                                          source=str(train_path), held_out_source=(
                                              None if eval_path is None else str(eval_path)))

    def scorer(problem: Problem, response: str) -> float:
        return float(math_equal(problem.answer, response))

    return Task(name=f"verl:{train_path}", train=problems, eval=held_out, scorer=scorer,
                extract=extract_answer)
