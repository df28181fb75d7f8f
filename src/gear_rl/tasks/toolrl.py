"""ToolRL function-calling data and reward.

Qian et al., "ToolRL: Reward is All Tool Learning Needs", arXiv 2504.13958 (code:
github.com/qiancheng0/ToolRL). The reward is ``R = R_format + R_correct``:

- ``R_format`` in {0, 1}: 1 when the response has the fields the gold output has, in order
  (``<think>...</think>`` then ``<tool_call>...</tool_call>`` and/or ``<response>...</response>``,
  each exactly once), else 0.
- ``R_correct = 6 * S / S_max - 3`` in [-3, 3], where for gold calls ``G`` and predicted calls
  ``P``, ``S = r_name + sum over matched pairs (r_param + r_value)``:

  * ``r_name``: Jaccard overlap of the tool names of ``P`` and ``G`` (in [0, 1]);
  * ``r_param`` of a pair: Jaccard overlap of the parameter names (in [0, 1]);
  * ``r_value`` of a pair: the number of gold parameters whose predicted value is exactly equal;
  * ``S_max = 1 + |G| + sum_j |keys(G_j)|``; pairs are the matching of ``P`` to ``G`` that
    maximises ``S`` (the paper: an optimal assignment).

Reading notes, where the paper is silent or the released code decides (each is a knob):

1. Names are compared as multisets (``Counter`` Jaccard, as the released ``match_score``), so a
   parallel call of the same tool twice must be predicted twice.
2. Only calls with the same name are paired (the released code pairs by name); a call to the
   wrong tool earns no parameter credit.
3. The assignment is optimal (Hungarian-style, as the paper says); the released code pairs
   greedily in gold order, which can score lower. ``matching="greedy"`` reproduces it.
4. Value equality is Python ``==`` on the parsed JSON except that booleans never equal numbers
   (``True == 1`` in Python).
5. A response whose tool call is missing or does not parse as JSON gets ``R_correct = -3``.
6. A gold answer with no tool call (a plain ``<response>``): the released code gives
   ``R_correct = 0`` whatever the model does (the paper's text does not cover it); default
   ``no_call_gold="zero"``. ``"match"`` gives +3 when the response makes no call, else -3.
7. ``R_format`` follows the released checks: fields separated by single newlines, the
   ``<tool_call>`` body on its own lines. ``require_think=False`` makes ``<think>`` optional (for
   models never taught it).

Data layout (ToolRL's raw files): rows with ``instruction`` (the system prompt: tools and output
format), ``input`` (the dialogue) and ``output`` (the gold: ``<think>...</think>`` then
``<tool_call>`` with one ``{"name": ..., "parameters": {...}}`` JSON object per line, or a
``<response>``). verl-converted rows (``prompt`` messages plus ``reward_model.ground_truth``) load
too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gear_rl.safe_json import loads_bounded
from gear_rl.tasks.base import (
    DEFAULT_EVAL_SIZE,
    Located,
    Problem,
    Task,
    distinct_problems,
    split_train_eval,
)

__all__ = [
    "ToolRLScore",
    "correctness_reward",
    "extract_tool_calls",
    "format_reward",
    "load_toolrl_rows",
    "toolrl_problem",
    "toolrl_reward",
    "toolrl_task",
]

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_RESPONSE_BLOCK = re.compile(r"<response>(.*?)</response>", re.S)
Call = dict[str, Any]


# --- parsing --------------------------------------------------------------------------------
def _normalise_call(obj: Any) -> Call:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError(f"a tool call must be an object with a string 'name', got {obj!r:.80}")
    params = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(params, str):
        params = loads_bounded(params) if params.strip() else {}
    if not isinstance(params, dict):
        raise ValueError(f"parameters of {obj['name']!r} must be an object")
    return {"name": obj["name"], "parameters": params}


def extract_tool_calls(text: str) -> list[Call] | None:
    """The calls in the first ``<tool_call>`` block: one JSON object per line (ToolRL), or one
    JSON object / list spanning the block. ``None`` when there is no complete block. Raises
    ``ValueError`` when the block does not parse (JSON nested past
    :data:`gear_rl.safe_json.MAX_JSON_DEPTH` included: never ``RecursionError``)."""
    match = _TOOL_CALL_BLOCK.search(text)
    if match is None:
        return None
    body = match.group(1).strip()
    if not body:
        raise ValueError("empty <tool_call> block")
    try:
        parsed = loads_bounded(body)
        objects = parsed if isinstance(parsed, list) else [parsed]
    except json.JSONDecodeError:
        objects = [loads_bounded(line) for line in body.splitlines() if line.strip()]
    return [_normalise_call(obj) for obj in objects]


# --- format reward --------------------------------------------------------------------------
def format_reward(response: str, gold: str, *, require_think: bool = True) -> float:
    """``R_format``: 1.0 when ``response`` has exactly the fields ``gold`` has, in order."""
    text = response.strip()
    think = r"<think>.*?</think>\n" if require_think else r"(?:<think>.*?</think>\n)?"
    has_call, has_response = "<tool_call>" in gold, "<response>" in gold
    if has_call and has_response:
        pattern = think + r"<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>"
    elif has_call:
        pattern = think + r"<tool_call>\n.*?\n</tool_call>"
    elif has_response:
        pattern = think + r"<response>.*?</response>"
    else:  # a gold with neither field: only the reasoning is checked
        pattern = r"<think>.*?</think>" if require_think else r".*"
    if not re.fullmatch(pattern, text, re.S):
        return 0.0
    counts_ok = all(text.count(tag) == 1 for tag in (
        (["<tool_call>", "</tool_call>"] if has_call else [])
        + (["<response>", "</response>"] if has_response else [])))
    if require_think:
        counts_ok = counts_ok and text.count("<think>") == 1 and text.count("</think>") == 1
    return 1.0 if counts_ok else 0.0


# --- correctness reward ---------------------------------------------------------------------
def _same_value(a: Any, b: Any) -> bool:
    """Exact equality of parsed JSON values; 2 == 2.0, but a boolean never equals a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _multiset_jaccard(first: Sequence[Any], second: Sequence[Any]) -> float:
    """Jaccard overlap counting repeats (the released ``match_score``); 1 for two empty lists."""
    if list(first) == list(second):
        return 1.0
    if not first or not second:
        return 0.0
    a, b = Counter(first), Counter(second)
    intersection = sum((a & b).values())
    return intersection / (len(first) + len(second) - intersection)


def _pair_score(gold: Call, pred: Call) -> float:
    if gold["name"] != pred["name"]:
        return 0.0
    gold_params, pred_params = gold["parameters"], pred["parameters"]
    keys = _multiset_jaccard(sorted(gold_params), sorted(pred_params))
    values = sum(1.0 for k, v in gold_params.items()
                 if k in pred_params and _same_value(pred_params[k], v))
    return keys + values


def _max_assignment(scores: list[list[float]]) -> float:
    """Maximum total score of a one-to-one assignment of rows to columns (rectangular;
    Hungarian algorithm on the negated, square-padded matrix)."""
    rows = len(scores)
    cols = len(scores[0]) if rows else 0
    if rows == 0 or cols == 0:
        return 0.0
    size = max(rows, cols)
    cost = [[-(scores[i][j]) if i < rows and j < cols else 0.0 for j in range(size)]
            for i in range(size)]
    inf = float("inf")
    u, v = [0.0] * (size + 1), [0.0] * (size + 1)
    assigned, way = [0] * (size + 1), [0] * (size + 1)
    for i in range(1, size + 1):
        assigned[0] = i
        j0 = 0
        minv, used = [inf] * (size + 1), [False] * (size + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = assigned[j0], inf, 0
            for j in range(1, size + 1):
                if not used[j]:
                    current = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if current < minv[j]:
                        minv[j], way[j] = current, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(size + 1):
                if used[j]:
                    u[assigned[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if assigned[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            assigned[j0] = assigned[j1]
            j0 = j1
    return sum(scores[assigned[j] - 1][j - 1] for j in range(1, size + 1)
               if assigned[j] and assigned[j] - 1 < rows and j - 1 < cols)


def _greedy_assignment(gold: Sequence[Call], pred: Sequence[Call]) -> float:
    """The released code's pairing: each gold call in order takes its best unused prediction."""
    used: set[int] = set()
    total = 0.0
    for g in gold:
        best, best_index = 0.0, -1
        for index, p in enumerate(pred):
            if index in used or p["name"] != g["name"]:
                continue
            score = _pair_score(g, p)
            if score > best:
                best, best_index = score, index
        if best_index >= 0:
            used.add(best_index)
            total += best
    return total


def correctness_reward(pred: Sequence[Call], gold: Sequence[Call], *,
                       matching: Literal["optimal", "greedy"] = "optimal"
                       ) -> tuple[float, float, float]:
    """``(R_correct, S, S_max)`` for parsed predicted and gold calls (``{"name", "parameters"}``).

    ``gold`` must hold at least one call. At most 64 predicted calls are considered (the rest are
    treated as absent from the pairing but still count in the name overlap).
    """
    if not gold:
        raise ValueError("gold must hold at least one call")
    if matching not in ("optimal", "greedy"):
        raise ValueError(f"matching must be 'optimal' or 'greedy', got {matching!r}")
    s_max = 1.0 + sum(1.0 + len(g["parameters"]) for g in gold)
    score = _multiset_jaccard([g["name"] for g in gold], [p["name"] for p in pred])
    candidates = list(pred)[:64]
    if matching == "optimal":
        score += _max_assignment([[_pair_score(g, p) for p in candidates] for g in gold])
    else:
        score += _greedy_assignment(gold, candidates)
    return 6.0 * score / s_max - 3.0, score, s_max


@dataclass(frozen=True)
class ToolRLScore:
    """A response's ToolRL reward and its parts.

    Attributes:
        format: ``R_format`` in {0, 1}.
        correct: ``R_correct`` in [-3, 3].
        total: ``format + correct`` in [-3, 4].
        unit: ``(total + 3) / 7`` in [0, 1]; exactly 1 for a fully correct response.
        match, match_max: ``S`` and ``S_max`` (0 and 0 when no matching was computed).
        error: why the predicted call could not be scored, if it could not.
    """

    format: float
    correct: float
    match: float = 0.0
    match_max: float = 0.0
    error: str | None = None

    @property
    def total(self) -> float:
        return self.format + self.correct

    @property
    def unit(self) -> float:
        return (self.total + 3.0) / 7.0


def toolrl_reward(
    response: str,
    gold: str,
    *,
    require_think: bool = True,
    no_call_gold: Literal["zero", "match"] = "zero",
    matching: Literal["optimal", "greedy"] = "optimal",
) -> ToolRLScore:
    """The ToolRL reward of ``response`` against the gold ``output`` text (see the module
    docstring for the reading of each part)."""
    if not isinstance(response, str) or not isinstance(gold, str):
        raise ValueError("response and gold must be strings")
    if no_call_gold not in ("zero", "match"):
        raise ValueError(f"no_call_gold must be 'zero' or 'match', got {no_call_gold!r}")
    r_format = format_reward(response, gold, require_think=require_think)
    try:
        gold_calls = extract_tool_calls(gold)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"gold: its <tool_call> block does not parse: {exc}") from exc
    if gold_calls is None:
        if no_call_gold == "zero":
            return ToolRLScore(format=r_format, correct=0.0)
        predicted_call = _TOOL_CALL_BLOCK.search(response) is not None
        return ToolRLScore(format=r_format, correct=-3.0 if predicted_call else 3.0)
    try:
        pred_calls = extract_tool_calls(response)
    except (ValueError, TypeError) as exc:
        return ToolRLScore(format=r_format, correct=-3.0, error=f"unparsable tool call: {exc}")
    if pred_calls is None:
        return ToolRLScore(format=r_format, correct=-3.0, error="no <tool_call> block")
    correct, score, s_max = correctness_reward(pred_calls, gold_calls, matching=matching)
    return ToolRLScore(format=r_format, correct=correct, match=score, match_max=s_max)


# --- data -----------------------------------------------------------------------------------
def load_toolrl_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ToolRL file: ``.json`` (a list), ``.jsonl`` or ``.parquet``."""
    from gear_rl.tasks.verl_data import load_rows

    return load_rows(path)


def _reference(gold: str) -> tuple[str, str]:
    """What the teacher is shown: the gold ``<tool_call>`` block (kind ``tool_call``), else the
    gold ``<response>`` (kind ``answer``)."""
    block = _TOOL_CALL_BLOCK.search(gold)
    if block is not None:
        return f"<tool_call>{block.group(1)}</tool_call>", "tool_call"
    response = _RESPONSE_BLOCK.search(gold)
    return (response.group(0) if response else gold.strip()), "answer"


def toolrl_problem(row: Mapping[str, Any], index: int, split: str = "train",
                   where: str = "") -> Problem:
    """One ToolRL row (raw ``instruction``/``input``/``output`` or verl-converted) as a Problem.

    ``where`` names the row in errors (default ``"SPLIT row INDEX"``). Raw rows need three
    strings and a non-blank ``input``; a verl-converted row's ``prompt`` follows
    :func:`gear_rl.tasks.verl_data.chat_prompt`. The gold output (``output`` or
    ``reward_model.ground_truth``) must be non-blank text; any other type is refused, naming
    the field.
    """
    from gear_rl.tasks.verl_data import chat_prompt

    where = where or f"{split} row {index}"
    if "output" in row:
        for key in ("instruction", "input", "output"):
            if not isinstance(row.get(key), str):
                raise ValueError(f"{where}: '{key}' must be a string, got "
                                 f"{type(row.get(key)).__name__}")
        if not row["input"].strip():
            raise ValueError(f"{where}: 'input' (the user turn) is blank; give the request or "
                             "drop the row")
        messages = ([{"role": "system", "content": row["instruction"]}]
                    if row["instruction"].strip() else [])
        messages.append({"role": "user", "content": row["input"]})
        gold, gold_field = row["output"], "output"
    elif "prompt" in row and isinstance(row.get("reward_model"), Mapping):
        messages = chat_prompt(row["prompt"], where)
        gold, gold_field = row["reward_model"].get("ground_truth"), "reward_model.ground_truth"
        if not isinstance(gold, str):
            raise ValueError(f"{where}: '{gold_field}' must be ToolRL's gold output text (with "
                             f"<tool_call> or <response>), got {type(gold).__name__}")
    else:
        raise ValueError(f"{where}: needs 'instruction'/'input'/'output' (ToolRL) or "
                         "'prompt' and 'reward_model.ground_truth' (verl)")
    if not gold.strip():
        raise ValueError(f"{where}: '{gold_field}' (the gold output) is blank; give the gold "
                         "<tool_call> or <response> or drop the row")
    try:
        extract_tool_calls(gold)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: the gold <tool_call> block does not parse: {exc}") from exc
    reference, kind = _reference(gold)
    return Problem(id=f"{split}/{row.get('id', index)}", prompt=messages, answer=gold,
                   reference=reference, reference_kind=kind,
                   data_source=str(row.get("data_source", "toolrl")))


def _located_toolrl_problems(path: str | Path, split: str,
                             limit: int | None = None) -> list[Located]:
    """A ToolRL file's distinct problems (the first ``limit``; None: all) with their places
    (:func:`gear_rl.tasks.base.distinct_problems`)."""
    from gear_rl.tasks.verl_data import located_rows

    return distinct_problems(((where, toolrl_problem(row, index, split, where))
                              for index, (where, row) in enumerate(located_rows(path))),
                             split=split, source=str(path), limit=limit)


def toolrl_task(
    train_path: str | Path,
    *,
    eval_path: str | Path | None = None,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    train_size: int | None = None,
    reward_scale: Literal["unit", "paper"] = "unit",
    require_think: bool = True,
    no_call_gold: Literal["zero", "match"] = "zero",
    matching: Literal["optimal", "greedy"] = "optimal",
) -> Task:
    """A :class:`~gear_rl.tasks.Task` from ToolRL files.

    Args:
        train_path: training rows; ``eval_path``: held-out rows (None: hold out ``eval_size``
            problems of ``train_path`` chosen by ``seed``). Rows repeating an earlier row's
            prompt, and training rows with a held-out prompt, are left out with a warning
            (:func:`gear_rl.tasks.base.split_train_eval`).
        train_size: keep at most this many training problems.
        reward_scale: ``"unit"`` (default) scores ``(R + 3) / 7`` in [0, 1], so a fully correct
            response scores exactly 1 as the trainer's accuracy expects; GRPO's std-normalised
            advantages are unchanged by this affine map (Dr.GRPO's are scaled by 1/7).
            ``"paper"`` scores ``R = R_format + R_correct`` in [-3, 4].
        require_think, no_call_gold, matching: see :func:`toolrl_reward`.
    """
    if reward_scale not in ("unit", "paper"):
        raise ValueError(f"reward_scale must be 'unit' or 'paper', got {reward_scale!r}")
    located = _located_toolrl_problems(train_path, "train")
    located_held_out = None
    if eval_path is not None:
        located_held_out = _located_toolrl_problems(eval_path, "eval", limit=eval_size)
    problems, held_out = split_train_eval(located, located_held_out, eval_size=eval_size,
                                          seed=seed, train_size=train_size,
                                          source=str(train_path), held_out_source=(
                                              None if eval_path is None else str(eval_path)))

    def scorer(problem: Problem, response: str) -> float:
        score = toolrl_reward(response, problem.answer, require_think=require_think,
                              no_call_gold=no_call_gold, matching=matching)
        return score.unit if reward_scale == "unit" else score.total

    def extract(response: str) -> str | None:
        block = _TOOL_CALL_BLOCK.search(response) or _RESPONSE_BLOCK.search(response)
        return block.group(0) if block else None

    return Task(name=f"toolrl:{train_path}", train=problems, eval=held_out, scorer=scorer,
                extract=extract)
