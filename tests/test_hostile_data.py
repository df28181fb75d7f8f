"""Hostile dataset files (issue 40): a problem is its prompt, so no held-out prompt is trained
on however the rows repeat; ground truths and prompts follow one rule per type (docs/data.md):
converted where unambiguous, refused in one line naming the file, the row and the field where
not."""

from __future__ import annotations

import json
import math
import random
import re
import warnings
from decimal import Decimal

import pytest

from gear_rl.tasks import load_task, verl_task
from gear_rl.tasks.toolrl import toolrl_task


def _row(question, answer, **extra) -> dict:
    return {"data_source": "hostile", "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": answer}, **extra}


def _jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _parquet(path, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def _prompts(problems) -> list[str]:
    return [problem.prompt[-1]["content"] for problem in problems]


# --- 3. a held-out problem is never trained on ----------------------------------------------
def test_twenty_identical_rows_are_one_problem_and_the_split_refuses(tmp_path) -> None:
    """The issue's example: 20 identical rows were split 16 train / 4 held out."""
    path = tmp_path / "same.jsonl"
    _jsonl(path, [_row("What is 1 + 1?", "2")] * 20)
    with pytest.warns(UserWarning, match=r"19 row\(s\) repeat the prompt") as caught, \
            pytest.raises(ValueError, match="1 distinct problem") as excinfo:
        load_task(str(path), eval_size=4)
    assert str(path) in _one_line(excinfo) and "eval_data" in str(excinfo.value)
    assert f"first: {path} line 2 repeats {path} line 1" in str(caught[0].message)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_repeated_prompts_never_straddle_the_split(tmp_path, suffix) -> None:
    """Six problems, each written three times at scattered rows, some with a different index,
    solution or data_source (what the policy does not see): every seed holds out problems the
    training split lacks, and each problem counts once."""
    rows = [_row(f"What is {i} times 3?", str(3 * i), extra_info={"index": 10 * copy + i,
                                                                   "solution": f"copy {copy}"})
            for copy in range(3) for i in range(6)]
    random.Random(0).shuffle(rows)
    path = tmp_path / f"rows{suffix}"
    if suffix == ".jsonl":
        _jsonl(path, rows)
    else:
        _parquet(path, {key: [row[key] for row in rows] for key in rows[0]})
    for seed in range(8):
        with pytest.warns(UserWarning, match=r"12 row\(s\) repeat the prompt"):
            task = verl_task(path, eval_size=3, seed=seed)
        train, held = _prompts(task.train), _prompts(task.eval)
        assert len(held) == 3 and len(train) == 3, (seed, train, held)
        assert not set(train) & set(held)
        assert len({p.id for p in [*task.train, *task.eval]}) == 6


def test_a_repeated_prompt_with_another_answer_keeps_the_first_and_says_which(tmp_path) -> None:
    path = tmp_path / "conflict.jsonl"
    _jsonl(path, [_row("What is 2 + 2?", "4"), _row("What is 3 + 3?", "6"),
                  _row("What is 2 + 2?", "5"), _row("What is 5 + 5?", "10")])
    with pytest.warns(UserWarning) as caught:
        task = verl_task(path, eval_size=1, seed=0)
    message = str(next(w.message for w in caught if "repeat" in str(w.message)))
    assert f"first: {path} line 3 repeats {path} line 1" in message
    assert "1 of them with another answer" in message and "'5'" in message and "'4'" in message
    answers = {p.prompt[0]["content"]: p.answer for p in [*task.train, *task.eval]}
    assert answers == {"What is 2 + 2?": "4", "What is 3 + 3?": "6", "What is 5 + 5?": "10"}


def test_training_rows_with_a_held_out_prompt_are_left_out(tmp_path) -> None:
    train, held = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    _jsonl(train, [_row(f"q{i}", str(i)) for i in range(6)])
    _jsonl(held, [_row("q4", "4"), _row("q1", "1"), _row("q9", "9")])
    with pytest.warns(UserWarning, match=r"2 training row\(s\) have the prompt of a held-out") \
            as caught:
        task = load_task(str(train), eval_path=str(held), eval_size=8)
    assert f"first: {train} line 2 repeats {held} line 2" in str(caught[0].message)
    assert _prompts(task.train) == ["q0", "q2", "q3", "q5"]
    assert _prompts(task.eval) == ["q4", "q1", "q9"]

    _jsonl(held, [_row(f"q{i}", str(i)) for i in range(6)])
    with pytest.raises(ValueError, match="all 6 of its problems are also in the held-out file"):
        load_task(str(train), eval_path=str(held))


def test_eval_size_counts_distinct_held_out_problems(tmp_path) -> None:
    train, held = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    _jsonl(train, [_row(f"t{i}", str(i)) for i in range(4)])
    _jsonl(held, [_row("e0", "0"), _row("e0", "0"), _row("e1", "1"), _row("e0", "0"),
                  _row("e2", "2"), _row("bad", math.nan), _row("e3", "3")])
    with pytest.warns(UserWarning, match=r"2 row\(s\) repeat the prompt"):
        task = load_task(str(train), eval_path=str(held), eval_size=3)
    assert _prompts(task.eval) == ["e0", "e1", "e2"]  # rows past the third problem: not read
    with pytest.raises(ValueError, match=f"{held} line 6: 'reward_model.ground_truth'"):
        load_task(str(train), eval_path=str(held), eval_size=4)


def test_toolrl_files_count_each_prompt_once(tmp_path) -> None:
    gold = "<think>ok</think>\n<response>{}</response>"
    rows = [{"instruction": "", "input": f"say {word}", "output": gold.format(word)}
            for word in ("hi", "yes", "hi", "no", "yes", "hi")]
    path = tmp_path / "tools.jsonl"
    _jsonl(path, rows)
    with pytest.warns(UserWarning, match=r"3 row\(s\) repeat the prompt"):
        task = toolrl_task(path, eval_size=1, seed=0)
    train, held = _prompts(task.train), _prompts(task.eval)
    assert sorted(train + held) == ["say hi", "say no", "say yes"] and len(held) == 1


def test_distinct_rows_load_without_a_warning(tmp_path) -> None:
    path = tmp_path / "clean.jsonl"
    _jsonl(path, [_row(f"q{i}", str(i)) for i in range(5)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = load_task(str(path), eval_size=2)
    assert len(task.train) == 3 and len(task.eval) == 2


# --- 4. ground truths: one rule per type ------------------------------------------------------
@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        ('"2"', "2"),
        ("2", "2"),
        ("2.0", "2"),
        ("-0.0", "0"),
        ("0.5", "0.5"),
        ("1e-07", "0.0000001"),
        ("1e20", "100000000000000000000"),
        ('["7"]', "7"),
        ("[12]", "12"),
        ('" 3 "', " 3 "),
    ],
)
def test_ground_truth_conversions(tmp_path, gold: str, expected: str) -> None:
    path = tmp_path / "golds.jsonl"
    path.write_text(f'{{"prompt": "What is it?", "reward_model": {{"ground_truth": {gold}}}}}\n'
                    + json.dumps(_row("other", "1")) + "\n")
    task = load_task(str(path), eval_size=1)
    problem = next(p for p in [*task.train, *task.eval] if p.prompt[0]["content"] != "other")
    assert problem.answer == expected
    assert task.score(problem, f"so \\boxed{{{expected.strip()}}}") == 1.0


@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        ("NaN", "not a finite number"),
        ("Infinity", "not a finite number"),
        ("-Infinity", "not a finite number"),
        ('["1", "2"]', "a list of 2 answers"),
        ("[[]]", "a list inside a list"),
        ('[["2"]]', "a list inside a list"),
        ("[NaN]", "not a finite number"),
        ('{"answer": "2"}', "got dict"),
        ("true", "got bool"),
        ('[""]', "is blank"),
        ("[]", "an empty list"),
    ],
)
def test_ground_truths_of_an_unusable_type_are_refused(tmp_path, gold: str, expected) -> None:
    """The issue's examples: NaN became "nan" (so ``\\boxed{nan}`` scored correct), a list kept
    its first element, a dict became its repr, ``[[]]`` was accepted where ``[]`` is refused."""
    path = tmp_path / "golds.jsonl"
    path.write_text(json.dumps(_row("first", "1")) + "\n"
                    + f'{{"prompt": "What is it?", "reward_model": {{"ground_truth": {gold}}}}}\n')
    with pytest.raises(ValueError, match=expected) as excinfo:
        load_task(str(path))
    assert _one_line(excinfo).startswith(f"{path} line 2: 'reward_model.ground_truth' ")


def test_parquet_ground_truth_columns(tmp_path) -> None:
    """Binary (bytes) became ``"b'2'"`` and never scored: refused. A double column writes
    integers as ``72.0`` and a decimal column ``1.50``: both converted."""
    import pyarrow as pa

    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(2)]
    path = tmp_path / "binary.parquet"
    _parquet(path, {"prompt": prompts, "reward_model": pa.array(
        [{"ground_truth": b"2"}, {"ground_truth": b"3"}],
        pa.struct([("ground_truth", pa.binary())]))})
    with pytest.raises(ValueError, match="is bytes") as excinfo:
        load_task(str(path))
    assert _one_line(excinfo).startswith(f"{path} row 1: 'reward_model.ground_truth' is bytes")

    path = tmp_path / "numbers.parquet"
    _parquet(path, {"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(4)],
                    "reward_model": pa.array(
        [{"ground_truth": 72.0}, {"ground_truth": 0.25}, {"ground_truth": 1e-7},
         {"ground_truth": -3.0}], pa.struct([("ground_truth", pa.float64())]))})
    task = load_task(str(path), eval_size=1)
    assert sorted(p.answer for p in [*task.train, *task.eval]) == [
        "-3", "0.0000001", "0.25", "72"]

    path = tmp_path / "decimal.parquet"
    _parquet(path, {"prompt": prompts, "reward_model": pa.array(
        [{"ground_truth": Decimal("1.50")}, {"ground_truth": Decimal("-2")}],
        pa.struct([("ground_truth", pa.decimal128(5, 2))]))})
    task = load_task(str(path), eval_size=1)
    assert sorted(p.answer for p in [*task.train, *task.eval]) == ["-2", "1.5"]


@pytest.mark.parametrize("value", ["72", 72, 72.0, ["72"], 0.5, 1e-7, Decimal("2.50"),
                                   float("nan"), ["7", "2"], [[]], b"7", {"a": 1}, None, True])
def test_verl_reward_reads_ground_truths_as_gear_rl_train_does(tmp_path, value) -> None:
    """``integrations.verl.rewards.math_gold`` is the same rule: the same text, or a refusal."""
    from gear_rl.integrations.verl.rewards import math_gold
    from gear_rl.tasks.verl_data import gold_answer

    try:
        expected = gold_answer(value)
    except ValueError as exc:
        with pytest.raises(ValueError, match=re.escape(f"ground_truth {exc}")):
            math_gold(value)
    else:
        assert math_gold(value) == expected


# --- 4. prompts: one rule per type ------------------------------------------------------------
@pytest.mark.parametrize(
    ("prompt", "field", "expected"),
    [
        ([{"role": "user", "content": None}], "prompt[0].content", "got NoneType"),
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "prompt[0].content",
         "got list"),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": {"text": "hi"}}],
         "prompt[1].content", "got dict"),
        ([{"role": "user", "content": 7}], "prompt[0].content", "got int"),
        ([{"role": None, "content": "hi"}], "prompt[0].role", "non-empty string"),
        ([{"role": "user"}], "prompt[0]", "'role', 'content'"),
        (["hi"], "prompt[0]", "got str"),
        ("", "prompt", "is blank"),
        ("  \n", "prompt", "is blank"),
        ([], "prompt", "non-empty list"),
        (None, "prompt", "got NoneType"),
        ({"role": "user", "content": "hi"}, "prompt", "got dict"),
        ([{"role": "user", "content": " "}], "prompt[0].content", "blank user message"),
    ],
)
def test_prompts_of_an_unusable_type_are_refused(tmp_path, prompt, field, expected) -> None:
    """The issue's examples: content ``null`` trained on the text "None", list-form content on
    its repr, ``prompt: ""`` was accepted."""
    path = tmp_path / "prompts.jsonl"
    _jsonl(path, [_row("first", "1"), _row("second", "2"),
                  {"prompt": prompt, "reward_model": {"ground_truth": "3"}}])
    with pytest.raises(ValueError, match=expected) as excinfo:
        load_task(str(path))
    assert _one_line(excinfo).startswith(f"{path} line 3: '{field}' ")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_prompt_with_no_user_turn_names_file_and_row(tmp_path, suffix) -> None:
    """Issue 40, class 10: such a prompt failed later (the teacher prompt) naming neither."""
    prompts = [[{"role": "user", "content": "q0"}],
               [{"role": "system", "content": "be brief"}, {"role": "assistant", "content": "ok"}]]
    path = tmp_path / f"no_user{suffix}"
    if suffix == ".jsonl":
        _jsonl(path, [{"prompt": p, "reward_model": {"ground_truth": "1"}} for p in prompts])
        where = f"{path} line 2"
    else:
        _parquet(path, {"prompt": prompts, "reward_model": [{"ground_truth": "1"}] * 2})
        where = f"{path} row 2"
    with pytest.raises(ValueError, match="no user message") as excinfo:
        load_task(str(path))
    message = _one_line(excinfo)
    assert message.startswith(f"{where}: 'prompt' has no user message")
    assert "['system', 'assistant']" in message


def test_system_and_assistant_turns_are_kept_as_written(tmp_path) -> None:
    path = tmp_path / "chat.jsonl"
    prompt = [{"role": "system", "content": ""}, {"role": "user", "content": "2 + 2?"},
              {"role": "assistant", "content": "4"}, {"role": "user", "content": "3 + 3?",
                                                       "name": "ignored"}]
    _jsonl(path, [{"prompt": prompt, "reward_model": {"ground_truth": "6"}}, _row("q", "1")])
    task = load_task(str(path), eval_size=1)
    problem = next(p for p in [*task.train, *task.eval] if len(p.prompt) == 4)
    assert problem.prompt == [{k: m[k] for k in ("role", "content")} for m in prompt]


# --- the teacher's reference and the other fields ---------------------------------------------
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"extra_info": {"solution": math.nan}}, "'extra_info.solution' must be a string"),
        ({"extra_info": {"solution": ["a", "b"]}}, "'extra_info.solution' must be a string"),
        ({"reward_model_solution": 4}, "'reward_model.solution' must be a string"),
        ({"extra_info": "{\"index\": 3}"}, "'extra_info' must be an object"),
    ],
)
def test_references_of_an_unusable_type_are_refused(tmp_path, extra, expected) -> None:
    row = _row("What is 2 + 2?", "4", **{k: v for k, v in extra.items()
                                          if k != "reward_model_solution"})
    if "reward_model_solution" in extra:
        row["reward_model"]["solution"] = extra["reward_model_solution"]
    path = tmp_path / "refs.jsonl"
    _jsonl(path, [_row("first", "1"), row])
    with pytest.raises(ValueError, match=expected) as excinfo:
        load_task(str(path))
    assert _one_line(excinfo).startswith(f"{path} line 2: ")


def test_reference_falls_back_to_the_answer_only_when_no_solution_is_given(tmp_path) -> None:
    path = tmp_path / "refs.jsonl"
    _jsonl(path, [_row("a", "1", extra_info={"solution": "  ", "index": 0}),
                  _row("b", "2", extra_info={"solution": None, "index": 1},
                       data_source=None),
                  _row("c", "3", extra_info={"solution": "", "index": 2}),
                  _row("d", "4", extra_info=None)])
    path.write_text(path.read_text().replace('"style": "rule", "ground_truth": "3"',
                                             '"ground_truth": "3", "solution": "1 + 2 = 3"'))
    task = load_task(str(path), eval_size=1)
    by_prompt = {p.prompt[0]["content"]: p for p in [*task.train, *task.eval]}
    assert [(by_prompt[q].reference, by_prompt[q].reference_kind) for q in "abcd"] == [
        ("1", "answer"), ("2", "answer"), ("1 + 2 = 3", "solution"), ("4", "answer")]
    assert by_prompt["b"].data_source == ""


# --- ToolRL files -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"instruction": "", "input": "  ", "output": "<response>x</response>"},
         "'input' (the user turn) is blank"),
        ({"instruction": "", "input": "hi", "output": ""}, "'output' (the gold output) is blank"),
        ({"instruction": None, "input": "hi", "output": "<response>x</response>"},
         "'instruction' must be a string, got NoneType"),
        ({"prompt": [{"role": "user", "content": None}],
          "reward_model": {"ground_truth": "<response>x</response>"}},
         "'prompt[0].content' must be a string"),
        ({"prompt": "hi", "reward_model": {"ground_truth": {"name": "f", "arguments": {}}}},
         "'reward_model.ground_truth' must be ToolRL's gold output text"),
        ({"prompt": "hi", "reward_model": {"ground_truth": None}},
         "'reward_model.ground_truth' must be ToolRL's gold output text"),
    ],
)
def test_toolrl_rows_of_an_unusable_type_are_refused(tmp_path, row, expected) -> None:
    path = tmp_path / "tools.jsonl"
    good = {"instruction": "", "input": "say hi", "output": "<response>hi</response>"}
    _jsonl(path, [good, row])
    with pytest.raises(ValueError, match=re.escape(expected)) as excinfo:
        toolrl_task(path)
    assert _one_line(excinfo).startswith(f"{path} line 2: ")
