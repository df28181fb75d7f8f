"""Rewards that pass wrong answers or crash (issue 56): the real scorers and parse paths on
hostile answers and hostile JSON.

- Numbers: a plain-number answer equals a plain-number gold only when their exact values do
  (``gear_rl.tasks.math_check``), through every path (math-verify, the last-number fallback,
  the verl reward, a verl-layout task), on any thread, at any length.
- JSON: model text and data files are parsed by ``gear_rl.safe_json.loads_bounded``: nesting
  past its bound is a malformed call (model text: never an exception out of the scorer or
  ``parse_turn``) or an error naming the file and line (data).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gear_rl.agent.parsing import JSON_FORMAT, parse_turn
from gear_rl.integrations.verl import rewards as verl_rewards
from gear_rl.safe_json import MAX_JSON_DEPTH, JSONTooDeepError, loads_bounded
from gear_rl.tasks import math_equal, verl_task
from gear_rl.tasks.answers import number_value
from gear_rl.tasks.bfcl import BFCLItem, load_bfcl, score_response
from gear_rl.tasks.toolrl import toolrl_reward, toolrl_task

LONG = "7" * 5000  # past Python's 4,300-digit int-to-string limit
DEEP = "[" * 1000 + "]" * 1000  # about 500 tokens of model output

WRONG = [  # (gold, response): a different number, which must score 0
    ("1234567", "<b>1234568</b>"),
    ("1234567", "\\text{1234568}"),
    ("1234567", "`1234568`"),
    ("-123456789", "−123456790"),  # Unicode minus
    ("0.1234567", "\\boxed{0.1234568}"),  # math-verify rounds decimals to 6 places
    ("\\frac{1}{3}", "\\boxed{0.3333334}"),
    ("\\frac{1}{3}", "\\boxed{0.333333}"),  # a rounding of 1/3 is another number
    ("1048576", "\\boxed{1048576.0000001}"),
    ("3", "so $x = 3.0000001$"),
    (LONG, "\\boxed{" + LONG[:-1] + "8}"),
    (LONG, LONG[:-1] + "8"),
    ("72", "72 apples and 3 pears"),
]
RIGHT = [  # (gold, response): the same value, which must score 1
    ("-123456789", "−123456789"),
    ("1234567", "<b>1234567</b>"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("\\frac{1}{2}", "the result is \\boxed{0.50}"),
    ("\\frac{2}{4}", "\\boxed{\\frac{1}{2}}"),  # math-verify: needs the main thread
    ("50\\%", "\\boxed{0.5}"),  # math-verify: needs the main thread
    ("1000", "\\boxed{1,000}"),
    ("3", "so $x = 3$"),
    ("\\sqrt{2}", "\\boxed{1.414214}"),  # the one tolerance: an irrational gold
    (LONG, "\\boxed{" + LONG + "}"),
    (LONG, "so it is " + LONG),
]


@pytest.mark.parametrize(("gold", "response"), WRONG)
def test_a_different_number_never_matches(gold: str, response: str) -> None:
    assert math_equal(gold, response) is False


@pytest.mark.parametrize(("gold", "response"), RIGHT)
def test_the_same_value_matches(gold: str, response: str) -> None:
    assert math_equal(gold, response) is True


def test_number_values_are_exact_at_any_length() -> None:
    assert number_value("0.5") == number_value("1/2") == number_value(".50")
    assert number_value("1,234,567") == 1234567 != number_value("1234568")
    assert number_value("−3") == -3
    assert number_value(LONG) == number_value(LONG + ".000") != number_value(LONG[:-1] + "8")
    for not_one_number in ("1,2", "1/0", "2e3", "12 3", "1/2/3", "", "x"):
        assert number_value(not_one_number) is None


def _in_thread(function: Callable[[], Any]) -> Any:
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(function()))
    worker.start()
    worker.join(300)
    assert out, "the scorer did not answer in its thread"
    return out[0]


def test_off_the_main_thread_every_answer_scores_as_on_it() -> None:
    cases = WRONG + RIGHT
    on_main = [math_equal(gold, response) for gold, response in cases]
    off_main = _in_thread(lambda: [math_equal(gold, response) for gold, response in cases])
    assert off_main == on_main == [False] * len(WRONG) + [True] * len(RIGHT)


def test_the_verl_math_reward_on_and_off_the_main_thread() -> None:
    def scores() -> list[float]:
        return [verl_rewards.math_verify_reward("openai/gsm8k", response, gold)
                for gold, response in WRONG + RIGHT]

    expected = [0.0] * len(WRONG) + [1.0] * len(RIGHT)
    assert scores() == expected
    assert _in_thread(scores) == expected
    assert verl_rewards.compute_score("openai/gsm8k", "\\boxed{1234568}", 1234567) == 0.0


def test_a_verl_layout_task_scores_exactly(tmp_path) -> None:
    path = tmp_path / "math.jsonl"
    rows = [{"prompt": f"q{i}", "reward_model": {"ground_truth": gold}}
            for i, gold in enumerate(["1234567", LONG, "0.1234567", "4", "5"])]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    task = verl_task(path, eval_size=1)
    by_answer = {p.answer: p for p in [*task.train, *task.eval]}
    assert task.score(by_answer["1234567"], "<b>1234568</b>") == 0.0
    assert task.score(by_answer["1234567"], "<b>1234567</b>") == 1.0
    assert task.score(by_answer[LONG], "\\boxed{" + LONG + "}") == 1.0
    assert task.score(by_answer["0.1234567"], "\\boxed{0.1234568}") == 0.0


# --- JSON nested past the bound -------------------------------------------------------------
def test_the_bound_is_checked_before_decoding() -> None:
    inside = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(inside) is not None
    with pytest.raises(JSONTooDeepError, match=f"deeper than {MAX_JSON_DEPTH}"):
        loads_bounded("[" + inside + "]")
    with pytest.raises(ValueError):
        loads_bounded(DEEP)
    assert loads_bounded(json.dumps({"s": DEEP})) == {"s": DEEP}  # brackets in a string: text
    assert loads_bounded(LONG) == int(LONG[:4000]) * 10 ** 1000 + int(LONG[4000:])


@pytest.mark.parametrize("body", [
    DEEP,
    '{"name": "f", "arguments": ' + DEEP + "}",
    '{"name": "f", "arguments": ' + json.dumps(DEEP) + "}",  # OpenAI-style string arguments
    '{"name": "f", "arguments": {}}\n' + DEEP,  # one object per line
])
def test_parse_turn_never_raises_on_deep_json(body: str) -> None:
    parsed = parse_turn(f"I will call it.\n<tool_call>\n{body}\n</tool_call>", JSON_FORMAT)
    assert parsed.status == "malformed"
    assert "deeper than" in (parsed.error or "")


def test_a_big_integer_argument_parses() -> None:
    parsed = parse_turn('<tool_call>{"name": "f", "arguments": {"n": ' + LONG + "}}</tool_call>",
                        JSON_FORMAT)
    assert parsed.status == "ok" and parsed.calls[0].arguments["n"] == int(LONG[:4000]) * (
        10 ** 1000) + int(LONG[4000:])


TOOLRL_GOLD = ("<think>add</think>\n<tool_call>\n"
               '{"name": "add", "parameters": {"a": 1}}\n</tool_call>')


@pytest.mark.parametrize("call", [DEEP, '{"name": "add", "parameters": ' + DEEP + "}",
                                  '{"name": "add", "parameters": ' + json.dumps(DEEP) + "}"])
def test_the_toolrl_scorers_score_deep_json_as_unparsable(call: str) -> None:
    response = f"<think>add</think>\n<tool_call>\n{call}\n</tool_call>"
    score = toolrl_reward(response, TOOLRL_GOLD)
    assert score.correct == -3.0 and "deeper than" in (score.error or "")
    verl_score = verl_rewards.toolrl_reward("gear_rl/toolrl", response, TOOLRL_GOLD)
    assert verl_score["correct"] == -3.0 and verl_score["acc"] == 0.0
    assert verl_rewards.compute_score("gear_rl/toolrl", response, TOOLRL_GOLD)["correct"] == -3.0


def test_a_deep_verl_toolrl_ground_truth_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"ground_truth.*deeper than"):
        verl_rewards.toolrl_reward("gear_rl/toolrl", TOOLRL_GOLD, DEEP)
    with pytest.raises(ValueError, match=r"ground_truth.*does not parse.*deeper than"):
        verl_rewards.toolrl_reward("gear_rl/toolrl", TOOLRL_GOLD,
                                   f"<tool_call>\n{DEEP}\n</tool_call>")


def test_bfcl_scores_deep_json_as_a_failed_decode() -> None:
    item = BFCLItem(id="x", category="simple_python", question=[],
                    functions=[{"name": "f", "parameters": {"properties": {}}}],
                    possible_answer=[{"f": {}}])
    result = score_response(f"<tool_call>\n{DEEP}\n</tool_call>", item)
    assert not result.valid and result.error_type == "decoder_failed"
    assert score_response('<tool_call>{"name": "f", "arguments": {}}</tool_call>', item).valid


def _at(path: Any, rest: str) -> str:
    """A ``match=`` pattern: the file's name as written, then ``rest`` (a pattern)."""
    return re.escape(str(path)) + rest


def test_deep_json_in_data_files_names_the_file_and_line(tmp_path) -> None:
    good = json.dumps({"prompt": "q", "reward_model": {"ground_truth": "1"}})
    deep_row = json.dumps({"prompt": "q2", "reward_model": {"ground_truth": "1"}})[:-1]
    deep_row += f', "extra_info": {{"x": {DEEP}}}}}'
    path = tmp_path / "deep.jsonl"
    path.write_text(f"{good}\n{deep_row}\n")
    with pytest.raises(ValueError, match=_at(path, r" line 2: not usable JSON .*deeper than")):
        verl_task(path, eval_size=1)
    as_json = tmp_path / "deep.json"
    as_json.write_text(f"[{good}, {deep_row}]")
    with pytest.raises(ValueError, match=_at(as_json, r": not usable JSON .*deeper than")):
        verl_task(as_json, eval_size=1)


def test_a_deep_toolrl_gold_names_the_row(tmp_path) -> None:
    row = {"instruction": "tools", "input": "add", "output": TOOLRL_GOLD}
    deep = {**row, "input": "add deep",
            "output": f"<think>add</think>\n<tool_call>\n{DEEP}\n</tool_call>"}
    path = tmp_path / "toolrl.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(deep) + "\n")
    pattern = _at(path, " line 2: the gold <tool_call> block does not parse: JSON nested deeper")
    with pytest.raises(ValueError, match=pattern):
        toolrl_task(path, eval_size=1)


def test_the_verl_converter_names_a_deep_json_file(tmp_path) -> None:
    from gear_rl.integrations.verl.data import source_rows

    path = tmp_path / "one.json"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match=_at(path, r": not usable JSON .*deeper than")):
        source_rows(path)


def test_a_deep_bfcl_file_names_the_file_and_line(tmp_path) -> None:
    question = {"id": "simple_python_0", "question": [[{"role": "user", "content": "hi"}]],
                "function": [{"name": "f", "parameters": {"properties": {}}}]}
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "BFCL_v4_simple_python.json").write_text(json.dumps(question) + "\n")
    answers = tmp_path / "possible_answer" / "BFCL_v4_simple_python.json"
    answers.write_text("\n" + json.dumps({"id": "simple_python_0", "ground_truth": []})[:-1]
                       + ', "x": ' + DEEP + "}\n")
    with pytest.raises(ValueError, match=_at(answers, r":2: not usable JSON .*deeper than")):
        load_bfcl("simple", data_dir=tmp_path)
    answers.write_text(json.dumps({"id": "simple_python_0", "ground_truth": [{"f": {}}]}) + "\n")
    assert load_bfcl("simple", data_dir=tmp_path)[0].possible_answer == [{"f": {}}]
    with pytest.raises(ValueError, match=r"BFCL data file .*BFCL_v4_multiple\.json"):
        load_bfcl("multiple", data_dir=tmp_path)


def test_a_deep_line_in_a_run_file_names_the_file_and_line(tmp_path) -> None:
    from gear_rl.rundir import read_jsonl

    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x": ' + DEEP + "}\n")
    with pytest.raises(ValueError, match=_at(path, r":2: not usable JSON .*deeper than")):
        read_jsonl(path)
