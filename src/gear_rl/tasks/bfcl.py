"""BFCL function-calling tasks with AST-style checking against the possible answers.

Data: the Berkeley Function Calling Leaderboard (Patil et al., "The Berkeley Function Calling
Leaderboard (BFCL): From Tool Use to Agentic Evaluation of Large Language Models", ICML 2025),
read from the JSON files shipped in the PyPI package ``bfcl-eval`` (Apache-2.0), installed with
``pip install --no-deps bfcl-eval==2026.3.23``: ``bfcl_eval/data/BFCL_v4_<category>.json`` holds
one question per line (``question``: the chat turns, ``function``: JSON-schema-like function
descriptions) and ``possible_answer/`` the matching ``ground_truth``: per expected call, per
parameter, the list of acceptable values (``""`` in the list: the parameter may be omitted).
Nothing of the package is imported; its heavy dependencies are not needed.

Checking follows BFCL's Python AST checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``),
re-implemented here for calls parsed from ``<tool_call>`` JSON instead of Python source:

- ``simple``: exactly one call; ``multiple``: exactly one call, to the one right function among
  several; ``parallel`` / ``parallel_multiple``: as many calls as expected, matched in any order.
- A call is valid when the function name matches, every required parameter is present, every
  given parameter is known to the function and to the answer, each value has the declared type
  (an int is accepted for a float; a value of the answer's own type is accepted as a "variable"),
  and the value is one of the acceptable ones: strings compared after BFCL's standardisation
  (lower case, spaces and ``,./-_*^`` removed, ``'`` as ``"``), lists element-wise likewise,
  dicts key by key; a parameter the answer lists without ``""`` must be given.

Not carried over: BFCL's model-specific renaming of dotted function names (here names are
compared as written), and its Java/JavaScript type converters (only the Python categories load).
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from gear_rl.agent.parsing import parse_json_calls
from gear_rl.dataclass_config import check_file
from gear_rl.rundir import read_jsonl
from gear_rl.tasks.base import DEFAULT_EVAL_SIZE, AgentSpec, Problem, Task

__all__ = [
    "BFCL_CATEGORIES",
    "BFCLItem",
    "CheckResult",
    "bfcl_data_dir",
    "bfcl_problem",
    "bfcl_system_prompt",
    "bfcl_task",
    "check_calls",
    "gold_calls",
    "load_bfcl",
    "parse_response_calls",
    "score_response",
]

BFCL_CATEGORIES = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
}
"""Short names -> BFCL v4 file categories (``simple_python`` etc. are accepted as well)."""

_PYTHON_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                                  "array": list, "tuple": list, "dict": dict, "any": str}
_NESTED_TYPES = ("array", "tuple")
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass(frozen=True)
class BFCLItem:
    """One BFCL question with its functions and acceptable answers."""

    id: str
    category: str
    question: list[dict[str, str]]
    functions: list[dict[str, Any]]
    possible_answer: list[dict[str, dict[str, list[Any]]]]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of a check: ``valid``, and BFCL-style ``error`` text and ``error_type``."""

    valid: bool
    error: str = ""
    error_type: str = ""


# --- data -----------------------------------------------------------------------------------
def bfcl_data_dir() -> Path:
    """``bfcl_eval/data`` of the installed ``bfcl-eval`` package (found without importing it)."""
    spec = importlib.util.find_spec("bfcl_eval")
    for location in (spec.submodule_search_locations or []) if spec else []:
        data = Path(location) / "data"
        if (data / "possible_answer").is_dir():
            return data
    raise FileNotFoundError("BFCL data not found: install it with "
                            "`pip install --no-deps bfcl-eval==2026.3.23`")


def _category_file(category: str) -> str:
    name = BFCL_CATEGORIES.get(category, category)
    if name not in BFCL_CATEGORIES.values():
        raise ValueError(f"category must be one of {sorted(BFCL_CATEGORIES)} (or "
                         f"{sorted(BFCL_CATEGORIES.values())}), got {category!r}")
    return name


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON object on each non-blank line of a BFCL file (:func:`gear_rl.rundir.read_jsonl`:
    a line that is not a JSON object, or nests past :data:`gear_rl.safe_json.MAX_JSON_DEPTH`, is
    a ``ValueError`` naming the file and line; a missing file one naming the file)."""
    return read_jsonl(check_file(path, "BFCL data file"))


def load_bfcl(category: str, *, data_dir: str | Path | None = None) -> list[BFCLItem]:
    """Every question of a category (``simple``, ``multiple``, ``parallel``,
    ``parallel_multiple``), joined with its possible answers by id."""
    name = _category_file(category)
    root = Path(data_dir) if data_dir is not None else bfcl_data_dir()
    questions = _read_lines(root / f"BFCL_v4_{name}.json")
    answers = {row["id"]: row["ground_truth"]
               for row in _read_lines(root / "possible_answer" / f"BFCL_v4_{name}.json")}
    items = []
    for row in questions:
        if row["id"] not in answers:
            raise ValueError(f"BFCL {name}: no possible answer for {row['id']}")
        if len(row["question"]) != 1:
            raise ValueError(f"BFCL {name}: {row['id']} is multi-turn; not supported here")
        items.append(BFCLItem(id=row["id"], category=name, question=row["question"][0],
                              functions=row["function"], possible_answer=answers[row["id"]]))
    return items


# --- checking (BFCL's AST checker, Python rules) ---------------------------------------------
def _standardise(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _answer_type(options: Sequence[Any]) -> type | None:
    for option in options:
        if option != "":
            return type(option)
    return None


def _type_check(param: str, value: Any, options: Sequence[Any], declared: str,
                expected: type, nested: type | None) -> tuple[CheckResult, bool]:
    """(result, is_variable): BFCL's ``type_checker`` (one level of nesting)."""
    answer_type = _answer_type(options)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return CheckResult(True), is_variable
        for option in options:
            # as BFCL: a non-list option (the "" of an omittable parameter) passes the check
            if not isinstance(option, list) or all(
                    _type_check(param, item, option, nested.__name__, nested, None)[0].valid
                    for item in cast(Iterable[Any], value)):
                return CheckResult(True), is_variable
        return CheckResult(False, f"Nested type checking failed for parameter {param!r}.",
                           "type_error:nested"), is_variable
    if answer_type is not None and type(value) is answer_type:
        return CheckResult(True), True
    return CheckResult(False, f"Incorrect type for parameter {param!r}. Expected type "
                              f"{declared}, got {type(value).__name__}.",
                       "type_error:simple"), is_variable


def _standardised_options(options: Sequence[Any]) -> list[Any]:
    return [_standardise(o) if isinstance(o, str) else o for o in options]


def _dict_check(param: str, value: dict, options: Sequence[Any]) -> CheckResult:
    result = CheckResult(False, f"Invalid dict for parameter {param!r}.", "dict_checker:unclear")
    for option in options:
        if option == "":
            continue
        ok = True
        for key, item in value.items():
            if key not in option:
                result, ok = CheckResult(False, f"Unexpected dict key parameter: {key!r}.",
                                         "value_error:dict_key"), False
                break
            standard = _standardise(item) if isinstance(item, str) else item
            if standard not in _standardised_options(option[key]):
                result, ok = CheckResult(False, f"Invalid value for parameter {key!r}: "
                                                f"{item!r}.", "value_error:dict_value"), False
                break
        if ok:
            for key, acceptable in option.items():
                if key not in value and "" not in acceptable:
                    result, ok = CheckResult(False, f"Missing dict key parameter: {key!r}.",
                                             "value_error:dict_key"), False
                    break
        if ok:
            return CheckResult(True)
    return result


def _list_of_dicts_check(param: str, value: list, options: Sequence[Any]) -> CheckResult:
    result = CheckResult(False, f"Invalid list of dicts for {param!r}.", "list_dict_checker")
    for option in options:
        if not isinstance(option, list) or len(option) != len(value):
            result = CheckResult(False, "Wrong number of dictionaries in the list.",
                                 "value_error:list_dict_count")
            continue
        checks = [_dict_check(param, item, [expected])
                  for item, expected in zip(value, option, strict=True)]
        failed = next((c for c in checks if not c.valid), None)
        if failed is None:
            return CheckResult(True)
        result = failed
    return result


def _check_function(description: Mapping[str, Any], output: Mapping[str, Any],
                    answer: Mapping[str, Mapping[str, list[Any]]]) -> CheckResult:
    """BFCL's ``simple_function_checker``: one predicted call against one expected call."""
    options = next(iter(answer.values()))
    name = description["name"]
    if name not in output:
        return CheckResult(False, f"Function name {name!r} not found in model output.",
                           "simple_function_checker:wrong_func_name")
    params = output[name]
    properties = description["parameters"].get("properties", {})
    for required in description["parameters"].get("required", []):
        if required not in params:
            return CheckResult(False, f"Missing required parameter: {required!r}.",
                               "simple_function_checker:missing_required")
    for param, value in params.items():
        if param not in properties or param not in options:
            return CheckResult(False, f"Unexpected parameter: {param!r}.",
                               "simple_function_checker:unexpected_param")
        declared = properties[param].get("type", "any")
        expected = _PYTHON_TYPES.get(declared, str)
        nested = None
        if declared in _NESTED_TYPES:
            nested = _PYTHON_TYPES.get(properties[param].get("items", {}).get("type", ""))
        if declared == "float" and type(value) is int:
            value = float(value)
        result, is_variable = _type_check(param, value, options[param], declared, expected,
                                          nested)
        if not result.valid:
            return result
        if not is_variable:
            if expected is dict:
                result = _dict_check(param, value, options[param])
            elif expected is list and nested is dict:
                result = _list_of_dicts_check(param, value, options[param])
            elif expected is str:
                if _standardise(value) not in [_standardise(o) for o in options[param]
                                               if isinstance(o, str)]:
                    result = CheckResult(False, f"Invalid value for parameter {param!r}: "
                                                f"{value!r}. Expected one of {options[param]}.",
                                         "value_error:string")
            elif expected is list:
                standard = _standardised_options(value)
                # as BFCL's list_checker: the "" of an omittable parameter reads as []
                acceptable: list[Any] = [_standardised_options(o) if isinstance(o, list) else []
                              for o in options[param] if isinstance(o, list) or o == ""]
                if standard not in acceptable:
                    result = CheckResult(False, f"Invalid value for parameter {param!r}: "
                                                f"{value!r}.", "value_error:list/tuple")
            else:
                result = (CheckResult(True) if value in options[param] else CheckResult(
                    False, f"Invalid value for parameter {param!r}: {value!r}. Expected one of "
                           f"{options[param]}.", "value_error:others"))
            if not result.valid:
                return result
            continue
        if value not in options[param]:
            return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. "
                                      f"Expected one of {options[param]}.", "value_error:others")
    for param, acceptable in options.items():
        if param not in params and "" not in acceptable:
            return CheckResult(False, f"Optional parameter {param!r} not provided and not "
                                      "marked as optional.",
                               "simple_function_checker:missing_optional")
    return CheckResult(True)


def _description(functions: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((f for f in functions if f["name"] == name), None)


def check_calls(calls: Sequence[Mapping[str, Mapping[str, Any]]], item: BFCLItem) -> CheckResult:
    """Check decoded calls (``[{name: {param: value}}]``, BFCL's form) against ``item``."""
    answers = item.possible_answer
    if item.category.startswith("parallel"):
        if len(calls) != len(answers):
            return CheckResult(False, "Wrong number of functions.",
                               "parallel_function_checker_no_order:wrong_count")
        matched: set[int] = set()
        for index, answer in enumerate(answers):
            description = _description(item.functions, next(iter(answer)))
            if description is None:
                return CheckResult(False, f"no description for answer {index}", "data_error")
            for candidate, call in enumerate(calls):
                if candidate not in matched and _check_function(description, call, answer).valid:
                    matched.add(candidate)
                    break
            else:
                return CheckResult(False, f"Could not find a matching function for index {index} "
                                          "of possible answers.",
                                   "parallel_function_checker_no_order:cannot_find_match")
        return CheckResult(True)
    if len(calls) != 1 or len(answers) != 1:
        kind = "multiple" if item.category == "multiple" else "simple"
        return CheckResult(False, "Wrong number of functions.",
                           f"{kind}_function_checker:wrong_count")
    description = _description(item.functions, next(iter(answers[0])))
    if description is None:
        return CheckResult(False, "no description for the expected function", "data_error")
    return _check_function(description, calls[0], answers[0])


def parse_response_calls(response: str) -> list[dict[str, dict[str, Any]]]:
    """Every call in every ``<tool_call>`` block of a response, as ``[{name: arguments}]``.
    Raises ``ValueError`` when there is none or a block does not parse."""
    blocks = _TOOL_CALL_BLOCK.findall(response)
    if not blocks:
        raise ValueError("no <tool_call> block")
    return [{call.name: dict(call.arguments)} for body in blocks
            for call in parse_json_calls(body)]


def score_response(response: str, item: BFCLItem) -> CheckResult:
    """Parse a response and check its calls."""
    try:
        calls = parse_response_calls(response)
    except (ValueError, TypeError) as exc:
        return CheckResult(False, str(exc), "decoder_failed")
    return check_calls(calls, item)


def _first_choice(options: Mapping[str, Sequence[Any]],
                  required: Sequence[str] = ()) -> dict[str, Any]:
    """The first acceptable value of each key; a key whose first choice is ``""`` (may be
    omitted) is left out, unless the function requires it (a few BFCL answers say both)."""
    chosen = {}
    for key, values in options.items():
        present = [v for v in values if v != ""]
        if present and (values[0] != "" or key in required):
            chosen[key] = present[0]
    return chosen


def gold_calls(item: BFCLItem) -> list[dict[str, Any]]:
    """One valid answer: per expected call, the first acceptable value of each parameter
    (parameters whose first acceptable value is ``""`` are left out unless required). Dict-typed
    parameters (and lists of dicts) hold acceptable values per key, resolved the same way."""
    calls = []
    for answer in item.possible_answer:
        name, options = next(iter(answer.items()))
        description = _description(item.functions, name) or {"parameters": {}}
        properties = description["parameters"].get("properties", {})
        # a few answers list a parameter the function does not have (always omittable)
        known = {k: v for k, v in options.items() if k in properties or "" not in v}
        arguments = _first_choice(known, description["parameters"].get("required", []))
        for param, value in arguments.items():
            declared = properties.get(param, {})
            if declared.get("type") == "dict" and isinstance(value, dict):
                arguments[param] = _first_choice(value)
            elif (declared.get("type") in _NESTED_TYPES
                  and declared.get("items", {}).get("type") == "dict" and isinstance(value, list)):
                arguments[param] = [_first_choice(v) if isinstance(v, dict) else v for v in value]
        calls.append({"name": name, "arguments": arguments})
    return calls


# --- prompts and tasks ----------------------------------------------------------------------
def bfcl_system_prompt(functions: Sequence[Mapping[str, Any]]) -> str:
    """The instruction listing the functions and the ``<tool_call>`` output format."""
    listing = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    return (
        "You are an assistant that answers by calling functions. Available functions:\n"
        f"{listing}\n\n"
        "Reply with a <tool_call> block holding one JSON object per call, one per line:\n"
        "<tool_call>\n"
        '{"name": "function_name", "arguments": {"parameter": "value"}}\n'
        "</tool_call>\n"
        "Make every call the request needs, with its required arguments, and nothing else."
    )


def _render_calls(calls: Sequence[Mapping[str, Any]]) -> str:
    lines = "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)
    return f"<tool_call>\n{lines}\n</tool_call>"


def bfcl_problem(item: BFCLItem) -> Problem:
    """A Problem whose reference (for the teacher) is one valid gold ``<tool_call>`` block."""
    reference = _render_calls(gold_calls(item))
    prompt = [{"role": "system", "content": bfcl_system_prompt(item.functions)}]
    prompt += [{"role": str(m["role"]), "content": str(m["content"])} for m in item.question]
    return Problem(id=item.id, prompt=prompt, answer=reference, reference=reference,
                   reference_kind="tool_call", data_source=f"bfcl:{item.category}",
                   metadata={"bfcl": item})


def bfcl_task(
    categories: Sequence[str] = ("simple", "multiple", "parallel"),
    *,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    train_size: int | None = None,
    data_dir: str | Path | None = None,
) -> Task:
    """BFCL categories as one task, scored 1.0 when the response's calls pass the AST check.

    BFCL is an evaluation set; here ``eval_size`` questions (chosen by ``seed``, across the
    categories) are held out and the rest are the training split.
    """
    if isinstance(categories, str) or not categories:
        raise ValueError(f"categories must be a non-empty sequence of names, got {categories!r}")
    items = [item for category in categories for item in load_bfcl(category, data_dir=data_dir)]
    problems = [bfcl_problem(item) for item in items]
    if not 0 < eval_size < len(problems):
        raise ValueError(f"eval_size must be in [1, {len(problems) - 1}], got {eval_size}")
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    held_out = [problems[i] for i in sorted(order[:eval_size])]
    train = [problems[i] for i in sorted(order[eval_size:])]
    if train_size is not None:
        train = train[:train_size]

    def scorer(problem: Problem, response: str) -> float:
        return 1.0 if score_response(response, problem.metadata["bfcl"]).valid else 0.0

    def extract(response: str) -> str | None:
        blocks = _TOOL_CALL_BLOCK.findall(response)
        return "\n".join(b.strip() for b in blocks) if blocks else None

    return Task(name=f"bfcl:{','.join(categories)}", train=train, eval=held_out, scorer=scorer,
                extract=extract,
                agent=AgentSpec(tool="none", tool_format="json", max_turns=1))
