"""Tasks: answer extraction, reasoning-gym splits and scoring, verl-layout files with
math-verify."""

from __future__ import annotations

import json

import pytest

from gear_rl.tasks import (
    Problem,
    extract_answer,
    last_boxed,
    last_number,
    load_rows,
    load_task,
    math_equal,
    reasoning_gym_task,
    verl_task,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("To calculate 5 - 3, we subtract 3 from 5, which gives us 2.", "2"),
        ("-9 - 8 = -17", "-17"),
        ("The result is −4.", "-4"),
        ("It is 1,234 apples", "1234"),
        ("so x = 2.50", "2.5"),
        ("half is 1/2", "1/2"),
        ("we get \\boxed{42} because 7 * 6 = 42 and 3 more", "42"),
        ("Answer: 12\nThen some rambling 99", "12"),
        ("final answer: 7.", "7"),
        ("no digits here", None),
        ("Answer: blue", "blue"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_last_boxed_nested_and_unclosed() -> None:
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1") is None
    assert last_boxed("nothing") is None
    assert last_number("a 3 b 4.0") == "4"


def test_reasoning_gym_arithmetic_split_and_scoring() -> None:
    task = reasoning_gym_task("arithmetic", train_size=300, eval_size=40, seed=0)
    eval_questions = {p.prompt[0]["content"] for p in task.eval}
    assert len(task.eval) == 40
    assert all(p.prompt[0]["content"] not in eval_questions for p in task.train)
    problem = task.eval[0]
    assert problem.reference == problem.answer
    assert problem.reference_kind == "answer"
    right = f"We compute it step by step, which is {problem.answer}."
    assert task.score(problem, right) == 1.0
    wrong = f"It is {int(problem.answer) + 1}."
    assert task.score(problem, wrong) == 0.0
    # reasoning-gym's default scorer gives partial credit for containing the answer; binary here
    assert task.score(problem, "It is 1" + problem.answer.lstrip("-") + "0") == 0.0
    assert task.score(problem, "no answer") == 0.0


def test_reasoning_gym_same_seed_same_data_and_options() -> None:
    a = reasoning_gym_task("products", train_size=20, eval_size=5, seed=3)
    b = load_task("rg:products", train_size=20, eval_size=5, seed=3)
    assert [p.prompt for p in a.train] == [p.prompt for p in b.train]
    c = load_task("basic_arithmetic", options={"min_terms": 3, "max_terms": 3},
                  train_size=5, eval_size=2, instruction=" Be brief.")
    assert c.train[0].prompt[0]["content"].endswith(" Be brief.")


def test_unknown_task_and_bad_options() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        load_task("no_such_task_xyz")
    with pytest.raises(ValueError, match="bad options"):
        load_task("arithmetic", options={"no_such_option": 1})
    with pytest.raises(ValueError, match="does not exist"):
        load_task("/nonexistent/file.jsonl")


def test_a_task_scored_on_the_first_number_ignores_what_follows_it() -> None:
    task = load_task("products", options={"answer_rule": "first_number"}, train_size=20,
                     eval_size=5, seed=0)
    default = load_task("products", train_size=20, eval_size=5, seed=0)
    assert [p.prompt for p in task.train] == [p.prompt for p in default.train]
    assert "first number" in task.name and "first number" not in default.name
    problem = task.eval[0]
    answer, wrong = problem.answer, str(int(problem.answer) + 1)
    assert task.score(problem, f"{answer}. Then rambling on: 3, 4, and {wrong}.") == 1.0
    assert default.score(problem, f"{answer}. Then rambling on: 3, 4, and {wrong}.") == 0.0
    assert task.score(problem, f"It is {wrong}, so the answer is {answer}") == 0.0
    assert task.score(problem, "no number at all") == 0.0
    assert task.extract(f"x {answer} y 9") == answer
    with pytest.raises(ValueError, match=r"task_options.answer_rule must be one of "
                                         r"\['final', 'first_number'\], got 'last'"):
        load_task("products", options={"answer_rule": "last"}, train_size=5, eval_size=2)


def _rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i, "solution": f"{i} + {i} = {2 * i}"} if i % 2 else {},
        }
        for i in range(n)
    ]


def test_verl_jsonl_and_parquet(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(10)
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(14)[10:]), parquet)  # prompts train lacks
    assert load_rows(parquet)[1]["reward_model"]["ground_truth"] == "22"

    task = load_task(str(jsonl), eval_path=str(parquet), eval_size=3)
    assert len(task.train) == 10 and len(task.eval) == 3
    odd = task.train[1]
    assert odd.reference_kind == "solution" and odd.reference == "1 + 1 = 2"
    assert task.train[2].reference_kind == "answer" and task.train[2].reference == "4"
    assert task.score(odd, "so the answer is \\boxed{2}") == 1.0
    assert task.score(odd, "It is 3.") == 0.0

    held = verl_task(jsonl, eval_size=4, seed=1)
    assert len(held.eval) == 4 and len(held.train) == 6
    assert not {p.id for p in held.eval} & {p.id for p in held.train}


def test_verl_bad_rows(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ValueError, match="ground_truth"):
        load_task(str(bad))
    bad.write_text(json.dumps({"prompt": 3, "reward_model": {"ground_truth": "1"}}) + "\n")
    with pytest.raises(ValueError, match="prompt"):
        load_task(str(bad))


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("0.5", "the result is \\boxed{1/2}", True),
        ("72", "She has 72 apples.", True),
        ("(x+1)^2", "We get $(x+1)^2$", True),
        ("72", "72 apples and 3 pears", False),
        ("-17", "-9 - 8 = -17", True),
    ],
)
def test_math_equal(gold: str, response: str, expected: bool) -> None:
    assert math_equal(gold, response) is expected


def test_problem_is_hashable_by_identity_fields() -> None:
    problem = Problem(id="x", prompt=[{"role": "user", "content": "q"}], answer="1",
                      reference="1", metadata={"entry": {}})
    assert problem.id == "x"
