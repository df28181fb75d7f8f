"""BFCL adapter: loading the bfcl-eval data files, the AST-style checker (hand cases and every
gold answer of the four categories), and the task."""

from __future__ import annotations

import json

import pytest

bfcl = pytest.importorskip("gear_rl.tasks.bfcl")
try:
    bfcl.bfcl_data_dir()
except FileNotFoundError:
    pytest.skip("bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)",
                allow_module_level=True)

from gear_rl.tasks.bfcl import (  # noqa: E402
    BFCLItem,
    bfcl_problem,
    bfcl_task,
    check_calls,
    gold_calls,
    load_bfcl,
    score_response,
)

SIZES = {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200}


def block(*calls: dict) -> str:
    return "<tool_call>\n" + "\n".join(json.dumps(c) for c in calls) + "\n</tool_call>"


@pytest.fixture(scope="module")
def items():
    return {category: load_bfcl(category) for category in SIZES}


def test_categories_load_with_answers(items):
    assert {c: len(v) for c, v in items.items()} == SIZES
    first = items["simple"][0]
    assert first.id == "simple_python_0" and first.question[0]["role"] == "user"
    assert first.functions[0]["name"] == "calculate_triangle_area"
    with pytest.raises(ValueError, match="category"):
        load_bfcl("live_simple")


def test_every_gold_answer_passes_its_own_check(items):
    for category, category_items in items.items():
        for item in category_items:
            result = score_response(block(*gold_calls(item)), item)
            assert result.valid, (category, item.id, result)


# simple_python_0: calculate_triangle_area(base=[10], height=[5], unit=["units", ""])
def _triangle(items) -> BFCLItem:
    return items["simple"][0]


@pytest.mark.parametrize("arguments, valid, error_type", [
    ({"base": 10, "height": 5}, True, ""),                       # unit may be omitted
    ({"base": 10, "height": 5, "unit": "Units"}, True, ""),      # strings: case-insensitive
    ({"base": 10, "height": 5, "unit": "cm"}, False, "value_error:string"),
    ({"base": 10}, False, "simple_function_checker:missing_required"),
    ({"base": 10, "height": 6}, False, "value_error:others"),
    ({"base": "10", "height": 5}, False, "type_error:simple"),
    ({"base": 10.0, "height": 5}, False, "type_error:simple"),  # a float where an int is due
    ({"base": 10, "height": 5, "color": "red"}, False, "simple_function_checker:unexpected_param"),
    ({"base": True, "height": 5}, False, "type_error:simple"),   # bool is not int
])
def test_simple_checker_cases(items, arguments, valid, error_type):
    result = check_calls([{"calculate_triangle_area": arguments}], _triangle(items))
    assert (result.valid, result.error_type) == (valid, error_type), result


def test_wrong_name_count_and_unparsable(items):
    item = _triangle(items)
    assert check_calls([{"triangle_area": {"base": 10, "height": 5}}], item).error_type == (
        "simple_function_checker:wrong_func_name")
    two = [{"calculate_triangle_area": {"base": 10, "height": 5}}] * 2
    assert check_calls(two, item).error_type == "simple_function_checker:wrong_count"
    assert score_response("no call here", item).error_type == "decoder_failed"
    assert score_response("<tool_call>{broken</tool_call>", item).error_type == "decoder_failed"


def test_float_parameter_accepts_an_int_and_strings_are_standardised(items):
    # find a simple item with a float parameter answered by a float
    for item in items["simple"]:
        [answer] = item.possible_answer
        name, options = next(iter(answer.items()))
        props = item.functions[0]["parameters"]["properties"]
        floats = [p for p, d in props.items() if d["type"] == "float" and p in options
                  and isinstance(options[p][0], float) and options[p][0].is_integer()]
        if floats:
            arguments = {p: v[0] for p, v in options.items() if v[0] != ""}
            arguments[floats[0]] = int(arguments[floats[0]])
            assert check_calls([{name: arguments}], item).valid, item.id
            break
    else:
        pytest.fail("no float parameter with an integral answer in simple_python")
    # "New York, NY" vs "new york ny": BFCL strips spaces and ,./-_*^ and lower-cases
    for item in items["simple"]:
        [answer] = item.possible_answer
        name, options = next(iter(answer.items()))
        texts = [(p, v[0]) for p, v in options.items() if isinstance(v[0], str) and " " in v[0]]
        if texts:
            arguments = {p: v[0] for p, v in options.items() if v[0] != ""}
            param, text = texts[0]
            arguments[param] = text.upper().replace(" ", "  ")
            assert check_calls([{name: arguments}], item).valid, item.id
            break


def test_parallel_calls_match_in_any_order(items):
    # parallel_0: spotify.play(Taylor Swift, 20) and spotify.play(Maroon 5, 15)
    item = items["parallel"][0]
    calls = gold_calls(item)
    assert len(calls) == 2
    assert score_response(block(*reversed(calls)), item).valid
    assert score_response(block(calls[0], calls[0]), item).error_type == (
        "parallel_function_checker_no_order:cannot_find_match")
    assert score_response(block(calls[0]), item).error_type == (
        "parallel_function_checker_no_order:wrong_count")
    # one call per block is fine too (the Hermes / Qwen habit)
    assert score_response(block(calls[0]) + "\n" + block(calls[1]), item).valid


def test_multiple_needs_the_right_function(items):
    item = items["multiple"][0]
    [gold] = gold_calls(item)
    other = next(f["name"] for f in item.functions if f["name"] != gold["name"])
    assert score_response(block(gold), item).valid
    wrong = {"name": other, "arguments": gold["arguments"]}
    assert score_response(block(wrong), item).error_type == (
        "simple_function_checker:wrong_func_name")


def test_problem_and_task(items):
    problem = bfcl_problem(items["parallel"][0])
    assert problem.reference_kind == "tool_call" and problem.reference.startswith("<tool_call>")
    assert problem.prompt[0]["role"] == "system" and "spotify.play" in problem.prompt[0]["content"]
    assert problem.prompt[1] == items["parallel"][0].question[0]
    task = bfcl_task(("simple", "parallel"), eval_size=50, seed=1)
    assert len(task.eval) == 50 and len(task.train) == 550
    assert not {p.id for p in task.eval} & {p.id for p in task.train}
    sample = task.eval[0]
    assert task.score(sample, sample.reference) == 1.0
    assert task.score(sample, "I cannot help.") == 0.0
    assert task.extract(sample.reference) is not None
    with pytest.raises(ValueError, match="eval_size"):
        bfcl_task(("simple",), eval_size=0)
    with pytest.raises(ValueError, match="categories"):
        bfcl_task("simple")


# --- agreement with BFCL's own checker -------------------------------------------------------
def _reference_checker():
    """BFCL's ``ast_checker`` module, executed from the installed source with its imports (model
    configs, Java/JS converters, which pull in API clients) replaced by stubs; None if absent."""
    import enum
    import sys
    import types

    source = bfcl.bfcl_data_dir().parent / "eval_checker" / "ast_eval" / "ast_checker.py"
    if not source.is_file():
        return None

    class Language(enum.Enum):
        PYTHON = "python"
        JAVA = "java"
        JAVASCRIPT = "javascript"

    class _Config:
        underscore_to_dot = False

    class _Configs(dict):
        def __getitem__(self, key):
            return _Config()

    stubs = {
        "bfcl_eval.constants.enums": {"Language": Language},
        "bfcl_eval.constants.model_config": {"MODEL_CONFIG_MAPPING": _Configs()},
        "bfcl_eval.constants.type_mappings": {"JAVA_TYPE_CONVERSION": {},
                                              "JS_TYPE_CONVERSION": {}},
        "bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter":
            {"java_type_converter": None},
        "bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter":
            {"js_type_converter": None},
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    namespace: dict = {}
    try:
        for name, attributes in stubs.items():
            module = types.ModuleType(name)
            module.__dict__.update(attributes)
            sys.modules[name] = module
        exec(compile(source.read_text(), str(source), "exec"), namespace)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return lambda item, decoded: namespace["ast_checker"](
        item.functions, decoded, item.possible_answer, Language.PYTHON, item.category,
        "gear-rl")["valid"]


def _perturbations(item: BFCLItem, rng) -> list[list[dict]]:
    import copy

    gold = gold_calls(item)
    variants = [gold]
    for kind in rng.sample(["drop", "value", "type", "swap", "drop_call", "duplicate", "name",
                            "extra", "int_float", "case"], 4):
        calls = copy.deepcopy(gold)
        call = rng.choice(calls)
        arguments = call["arguments"]
        key = rng.choice(sorted(arguments)) if arguments else None
        value = arguments.get(key)
        if kind == "drop" and key:
            del arguments[key]
        elif kind == "value" and key:
            arguments[key] = (not value if isinstance(value, bool) else value + 1
                              if isinstance(value, (int, float)) else value + "x"
                              if isinstance(value, str) else value[:-1] if isinstance(value, list)
                              else {})
        elif kind == "type" and key:
            arguments[key] = str(value)
        elif kind == "swap":
            calls.reverse()
        elif kind == "drop_call" and len(calls) > 1:
            calls.pop()
        elif kind == "duplicate":
            calls.append(copy.deepcopy(call))
        elif kind == "name":
            call["name"] = rng.choice([f["name"] for f in item.functions])
        elif kind == "extra":
            arguments["unexpected_parameter"] = 1
        elif kind == "int_float" and isinstance(value, (int, float)) and not isinstance(value,
                                                                                        bool):
            arguments[key] = int(value) if isinstance(value, float) else float(value)
        elif kind == "case" and isinstance(value, str):
            arguments[key] = value.upper().replace(" ", ", ")
        variants.append(calls)
    return variants


def test_checker_agrees_with_bfcl_reference_checker(items):
    import copy
    import random

    reference = _reference_checker()
    if reference is None:
        pytest.skip("bfcl-eval's ast_checker.py is not in the installed package")
    rng = random.Random(0)
    checked, disagreements = 0, []
    for category_items in items.values():
        for item in category_items:
            for calls in _perturbations(item, rng):
                decoded = [{c["name"]: c["arguments"]} for c in calls]
                ours = check_calls(decoded, item).valid
                theirs = reference(item, copy.deepcopy(decoded))
                checked += 1
                if ours != theirs:
                    disagreements.append((item.id, decoded, ours, theirs))
    assert checked == 5 * sum(SIZES.values())
    assert disagreements == [], disagreements[:3]
