"""ToolRL reward (arXiv 2504.13958): worked examples by hand, the optimal matching, the format
check, and the task built from ToolRL-layout files."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from gear_rl.tasks.toolrl import (
    correctness_reward,
    extract_tool_calls,
    format_reward,
    toolrl_reward,
    toolrl_task,
)

GOLD = ('<think>The user wants the weather.</think>\n<tool_call>\n'
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}\n'
        '</tool_call>')


def response(*calls: dict, think: str = "ok") -> str:
    lines = "\n".join(json.dumps(c) for c in calls)
    return f"<think>{think}</think>\n<tool_call>\n{lines}\n</tool_call>"


def weather(**params) -> dict:
    return {"name": "get_weather", "parameters": params}


# S_max = 1 (names) + 1 (one gold call) + 2 (its keys) = 4; R_correct = 6 S / 4 - 3.
@pytest.mark.parametrize("calls, match, r_correct", [
    # exact: names 1 + keys 1 + values 2 = 4
    ([weather(city="Paris", unit="celsius")], 4.0, 3.0),
    # one wrong value: 1 + 1 + 1 = 3
    ([weather(city="Paris", unit="fahrenheit")], 3.0, 1.5),
    # one key missing: 1 + 1/2 + 1 = 2.5
    ([weather(city="Paris")], 2.5, 0.75),
    # an extra key: keys {city, unit} vs {city, unit, days}: 2/3; values 2 -> 1 + 2/3 + 2
    ([weather(city="Paris", unit="celsius", days=3)], 1 + 2 / 3 + 2, 6 * (11 / 3) / 4 - 3),
    # wrong tool: no name overlap, no pair -> 0
    ([{"name": "get_time", "parameters": {"city": "Paris", "unit": "celsius"}}], 0.0, -3.0),
    # exact call plus an extra call: names [gw] vs [gw, gt] -> 1/2; pair 3 -> 3.5
    ([weather(city="Paris", unit="celsius"), {"name": "get_time", "parameters": {}}], 3.5, 2.25),
    # value types: "celsius" vs a number never match; 1 + 1 + 1 = 3
    ([weather(city="Paris", unit=0)], 3.0, 1.5),
])
def test_worked_examples_single_gold_call(calls, match, r_correct):
    score = toolrl_reward(response(*calls), GOLD)
    assert score.match == pytest.approx(match)
    assert score.match_max == 4.0
    assert score.correct == pytest.approx(r_correct)
    assert score.format == 1.0
    assert score.total == pytest.approx(1.0 + r_correct)


def test_parallel_calls_use_the_optimal_matching():
    gold = response({"name": "f", "parameters": {"a": 1, "b": 1}},
                    {"name": "f", "parameters": {"a": 2, "b": 2}})
    pred = response({"name": "f", "parameters": {"a": 1, "b": 2}},
                    {"name": "f", "parameters": {"a": 1, "b": 9}})
    # pair scores (key Jaccard 1 + matching values): gold1-pred1 2, gold1-pred2 2,
    # gold2-pred1 2, gold2-pred2 1. Optimal: gold1-pred2 + gold2-pred1 = 4; names 1 -> S = 5.
    # The released code's greedy pairing takes gold1-pred1 first and ends with 2 + 1 = 3 -> 4.
    s_max = 1 + (1 + 2) + (1 + 2)
    optimal = toolrl_reward(pred, gold)
    greedy = toolrl_reward(pred, gold, matching="greedy")
    assert (optimal.match, greedy.match) == (5.0, 4.0)
    assert optimal.correct == pytest.approx(6 * 5 / s_max - 3)
    assert greedy.correct == pytest.approx(6 * 4 / s_max - 3)
    # the same calls in another order score full marks
    swapped = response({"name": "f", "parameters": {"a": 2, "b": 2}},
                       {"name": "f", "parameters": {"a": 1, "b": 1}})
    assert toolrl_reward(swapped, gold).correct == 3.0
    # names count as a multiset: one call where two were due halves the name score
    single = toolrl_reward(response({"name": "f", "parameters": {"a": 1, "b": 1}}), gold)
    assert single.match == pytest.approx(0.5 + 3.0)


def test_optimal_matching_equals_brute_force():
    rng = random.Random(0)
    names = ["f", "g"]
    for _ in range(200):
        gold = [{"name": rng.choice(names), "parameters": {k: rng.randint(0, 2) for k in
                                                           rng.sample("abc", rng.randint(0, 3))}}
                for _ in range(rng.randint(1, 3))]
        pred = [{"name": rng.choice(names), "parameters": {k: rng.randint(0, 2) for k in
                                                           rng.sample("abcd", rng.randint(0, 3))}}
                for _ in range(rng.randint(0, 4))]
        _, score, _ = correctness_reward(pred, gold)
        from gear_rl.tasks.toolrl import _multiset_jaccard, _pair_score

        best = 0.0
        slots = list(range(len(pred))) + [None] * len(gold)
        for chosen in itertools.permutations(slots, len(gold)):
            total = sum(_pair_score(g, pred[j]) for g, j in zip(gold, chosen, strict=True)
                        if j is not None)
            best = max(best, total)
        names_score = _multiset_jaccard([g["name"] for g in gold], [p["name"] for p in pred])
        assert score == pytest.approx(names_score + best), (gold, pred)


def test_unparsable_or_missing_call_gets_minus_three():
    broken = ('<think>x</think>\n<tool_call>\n{"name": "get_weather", "parameters": {"city": \n'
              '</tool_call>')
    score = toolrl_reward(broken, GOLD)
    assert score.correct == -3.0 and "unparsable" in score.error
    assert score.format == 1.0  # the layout is right even though the JSON is not
    assert score.total == -2.0 and score.unit == pytest.approx(1 / 7)
    missing = toolrl_reward("<think>x</think>\n<response>It is sunny.</response>", GOLD)
    assert (missing.format, missing.correct) == (0.0, -3.0)
    assert toolrl_reward("", GOLD).total == -3.0


def test_gold_without_a_tool_call():
    gold = "<think>Just chat.</think>\n<response>Hello! How can I help?</response>"
    plain = "<think>greeting</think>\n<response>Hi there.</response>"
    calling = response(weather(city="Paris"))
    # released-code reading (default): correctness 0 whatever the response does
    assert toolrl_reward(plain, gold).total == 1.0
    assert toolrl_reward(calling, gold).total == 0.0  # format 0: a call where none was due
    # the alternative reading: +3 for no call, -3 for a call
    assert toolrl_reward(plain, gold, no_call_gold="match").correct == 3.0
    assert toolrl_reward(calling, gold, no_call_gold="match").correct == -3.0


def test_format_reward_cases():
    assert format_reward(response(weather(city="x")), GOLD) == 1.0
    assert format_reward("  " + response(weather(city="x")) + "\n", GOLD) == 1.0  # stripped
    no_think = '<tool_call>\n{"name": "get_weather", "parameters": {}}\n</tool_call>'
    assert format_reward(no_think, GOLD) == 0.0
    assert format_reward(no_think, GOLD, require_think=False) == 1.0
    two_blocks = response(weather(city="x")) + "\n<tool_call>\n{}\n</tool_call>"
    assert format_reward(two_blocks, GOLD) == 0.0
    assert format_reward(response(weather()) + " trailing", GOLD) == 0.0
    both_gold = GOLD + "\n<response>Done.</response>"
    assert format_reward(response(weather()) + "\n<response>ok</response>", both_gold) == 1.0
    assert format_reward(response(weather()), both_gold) == 0.0


def test_extract_tool_calls_layouts():
    assert extract_tool_calls("no call") is None
    assert extract_tool_calls(response(weather(city="a"), weather(city="b"))) == [
        weather(city="a"), weather(city="b")]
    listed = '<tool_call>[{"name": "f", "arguments": {"x": 1}}]</tool_call>'
    assert extract_tool_calls(listed) == [{"name": "f", "parameters": {"x": 1}}]
    with pytest.raises(ValueError):
        extract_tool_calls("<tool_call>\nnot json\n</tool_call>")


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="gold"):
        correctness_reward([], [])
    with pytest.raises(ValueError, match="gold"):
        toolrl_reward("x", "<tool_call>\n{oops\n</tool_call>")
    with pytest.raises(ValueError, match="matching"):
        correctness_reward([], [weather()], matching="fuzzy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no_call_gold"):
        toolrl_reward("x", GOLD, no_call_gold="maybe")  # type: ignore[arg-type]


def test_task_from_toolrl_layout_file(tmp_path):
    rows = [
        {"instruction": "You can call get_weather(city, unit).", "input": f"<user>q{i}</user>",
         "output": GOLD}
        for i in range(5)
    ] + [{"instruction": "sys", "input": "<user>hi</user>",
          "output": "<think>chat</think>\n<response>Hello.</response>"}]
    path = tmp_path / "toolrl.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = toolrl_task(path, eval_size=2, seed=0)
    assert len(task.train) == 4 and len(task.eval) == 2
    problem = next(p for p in [*task.train, *task.eval] if p.reference_kind == "tool_call")
    assert problem.prompt[0] == {"role": "system", "content": "You can call get_weather(city, "
                                                              "unit)."}
    assert problem.reference.startswith("<tool_call>") and "get_weather" in problem.reference
    assert task.score(problem, response(weather(city="Paris", unit="celsius"))) == 1.0
    assert task.score(problem, "") == 0.0
    assert task.extract(response(weather())).startswith("<tool_call>")
    paper = toolrl_task(path, eval_size=2, reward_scale="paper")
    assert paper.score(problem, response(weather(city="Paris", unit="celsius"))) == 4.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"instruction": "x", "input": "y"}))
    with pytest.raises(ValueError, match=f"{bad} line 1: needs"):
        toolrl_task(bad)
