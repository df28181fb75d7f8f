"""Bad dataset files fail at load with one line naming the file and the row, and rows never share
an id: repeated ids, empty references, malformed JSONL, non-UTF-8 bytes, missing parquet columns,
prompts longer than the model's context."""

from __future__ import annotations

import json
import warnings

import pytest

from gear_rl.tasks import check_prompt_lengths, load_task, math_equal, verl_task
from gear_rl.tasks.toolrl import toolrl_task


def _row(question: str, answer, index=None) -> dict:
    row = {"data_source": "merged", "prompt": [{"role": "user", "content": question}],
           "reward_model": {"style": "rule", "ground_truth": answer}}
    if index is not None:
        row["extra_info"] = {"index": index}
    return row


def _write(path, rows) -> None:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# --- repeated ids ---------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_repeated_index_gives_each_row_its_own_id_prompt_and_answer(tmp_path, suffix) -> None:
    """Two merged datasets both number their rows from 0: every row keeps its own prompt and
    answer under its own id, and one warning says the ids are positions now."""
    train = tmp_path / f"train{suffix}"
    _write(train, [_row("What is 1 + 1?", "2", index=0), _row("What is 3 + 4?", "7", index=0),
                   _row("What is 5 + 5?", "10", index=1)])
    held_out = tmp_path / f"eval{suffix}"
    _write(held_out, [_row("What is 2 + 2?", "4", index=0), _row("What is 9 + 9?", "18", index=1)])
    with pytest.warns(UserWarning, match="position") as caught:
        task = verl_task(train, eval_path=held_out)
    assert len([w for w in caught if "position" in str(w.message)]) == 1
    assert [p.id for p in task.train] == ["train/0", "train/1", "train/2"]
    by_id = {p.id: (p.prompt[0]["content"], p.answer) for p in task.train}
    assert by_id == {"train/0": ("What is 1 + 1?", "2"), "train/1": ("What is 3 + 4?", "7"),
                     "train/2": ("What is 5 + 5?", "10")}
    assert task.score(task.train[1], "so \\boxed{7}") == 1.0
    assert task.score(task.train[1], "so \\boxed{2}") == 0.0
    assert [p.id for p in task.eval] == ["eval/0", "eval/1"]  # distinct indices: kept


def test_an_index_equal_to_another_rows_position_is_a_repeat(tmp_path) -> None:
    train = tmp_path / "train.jsonl"
    _write(train, [_row("first", "1"), _row("second", "2", index=0), _row("third", "3", index=7)])
    with pytest.warns(UserWarning, match="position"):
        task = load_task(str(train), eval_size=1)
    problems = sorted([*task.train, *task.eval], key=lambda p: p.id)
    assert [(p.id, p.prompt[0]["content"]) for p in problems] == [
        ("train/0", "first"), ("train/1", "second"), ("train/2", "third")]


def test_unique_indices_are_kept_without_a_warning(tmp_path) -> None:
    train = tmp_path / "train.jsonl"
    _write(train, [_row(f"q{i}", str(i), index=100 + i) for i in range(4)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = load_task(str(train), eval_size=2)
    assert sorted(p.id for p in [*task.train, *task.eval]) == [f"train/{100 + i}" for i in range(4)]


def test_toolrl_repeated_ids_become_positions(tmp_path) -> None:
    train = tmp_path / "tools.jsonl"
    rows = [{"id": "a", "instruction": "", "input": f"say {word}",
             "output": f"<think>ok</think>\n<response>{word}</response>"}
            for word in ("hello", "bye", "yes")]
    _write(train, rows)
    with pytest.warns(UserWarning, match="position"):
        task = toolrl_task(train, eval_size=1)
    problems = sorted([*task.train, *task.eval], key=lambda p: p.id)
    assert [(p.id, p.prompt[-1]["content"]) for p in problems] == [
        ("train/0", "say hello"), ("train/1", "say bye"), ("train/2", "say yes")]


# --- empty references -----------------------------------------------------------------------
@pytest.mark.parametrize("empty", ["", "   ", [], [""], ["  "]])
def test_empty_ground_truth_is_refused_naming_file_and_line(tmp_path, empty) -> None:
    train = tmp_path / "train.jsonl"
    _write(train, [_row("What is 1 + 1?", "2"), _row("What is 0 + 0?", "0"),
                   _row("What is 10 - 10?", empty)])
    with pytest.raises(ValueError, match="ground_truth") as excinfo:
        load_task(str(train))
    assert f"{train} line 3:" in _one_line_error(excinfo)


def test_empty_ground_truth_in_parquet_names_the_row(tmp_path) -> None:
    train = tmp_path / "train.parquet"
    _write(train, [_row("What is 1 + 1?", "2"), _row("What is 10 - 10?", " ")])
    with pytest.raises(ValueError, match="empty") as excinfo:
        load_task(str(train))
    assert f"{train} row 2:" in _one_line_error(excinfo)


@pytest.mark.parametrize(
    ("gold", "response"),
    [
        ("", "the answer is 0"),
        ("  ", "so it is 10 - 10 = 0"),
        ("$ $", "0"),
        ("\\mathrm{}", "\\boxed{\\mathrm{}}"),
        ("\\,", "the answer is \\boxed{\\,}"),
        ("4", "2 + 2 = 4, so \\boxed{}"),
        ("0", "\\boxed{ }"),
    ],
)
def test_blank_gold_or_blank_answer_equals_nothing(gold: str, response: str) -> None:
    assert math_equal(gold, response) is False


@pytest.mark.parametrize(("gold", "response"), [("0", "\\boxed{0}"), ("0", "so it is 0"),
                                                ("\\{\\}", "\\boxed{\\{\\}}")])
def test_real_answers_still_match(gold: str, response: str) -> None:
    assert math_equal(gold, response) is True


# --- malformed rows -------------------------------------------------------------------------
def _jsonl_with(tmp_path, bad_line: bytes):
    """A jsonl file whose 4th line is ``bad_line`` (line 2 is blank, so lines and rows differ)."""
    good = json.dumps(_row("What is 1 + 1?", "2")).encode()
    path = tmp_path / "bad.jsonl"
    path.write_bytes(good + b"\n\n" + good + b"\n" + bad_line + b"\n" + good + b"\n")
    return path


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        (b'["prompt", "reward_model"]', "must be a JSON object"),
        (b'"just a string"', "must be a JSON object"),
        (json.dumps(_row("What is 2 + 2?", [])).encode(), "ground_truth"),
        (b'{"prompt": "hi", ', "not valid JSON"),
        (json.dumps(_row("What is 2 + 2?", "4"))[:-2].encode() + b"\xff\xfe}}", "not UTF-8"),
    ],
)
def test_malformed_jsonl_line_names_file_and_line(tmp_path, bad_line: bytes, expected) -> None:
    path = _jsonl_with(tmp_path, bad_line)
    with pytest.raises(ValueError, match=expected) as excinfo:
        load_task(str(path))
    assert _one_line_error(excinfo).startswith(f"{path} line 4:")


def test_non_utf8_names_the_byte_offset(tmp_path) -> None:
    path = tmp_path / "latin1.jsonl"
    first = (json.dumps(_row("What is 1 + 1?", "2")) + "\n").encode()
    second = json.dumps(_row("Was kostet der Käse?", "3"), ensure_ascii=False).encode("latin-1")
    path.write_bytes(first + second + b"\n")
    with pytest.raises(ValueError, match="not UTF-8") as excinfo:
        load_task(str(path))
    message = _one_line_error(excinfo)
    offset = len(first) + second.index("ä".encode("latin-1"))
    assert f"{path} line 2:" in message and f"byte {offset} " in message


def test_json_list_with_a_non_object_row(tmp_path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([_row("What is 1 + 1?", "2"), ["not", "a", "row"]]))
    with pytest.raises(ValueError, match="JSON object") as excinfo:
        load_task(str(path))
    assert _one_line_error(excinfo).startswith(f"{path} row 2:")


def test_parquet_missing_a_required_column_names_it(tmp_path) -> None:
    path = tmp_path / "no_reward.parquet"
    _write(path, [{"prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "x"}
                  for i in range(3)])
    with pytest.raises(ValueError, match="no 'reward_model' column") as excinfo:
        load_task(str(path))
    assert str(path) in _one_line_error(excinfo)

    path = tmp_path / "no_ground_truth.parquet"
    _write(path, [{"prompt": [{"role": "user", "content": f"q{i}"}],
                   "reward_model": {"style": "rule"}} for i in range(3)])
    with pytest.raises(ValueError, match=r"no 'reward_model\.ground_truth' column") as excinfo:
        load_task(str(path))
    assert str(path) in _one_line_error(excinfo)

    path = tmp_path / "no_prompt.parquet"
    _write(path, [{"question": f"q{i}", "reward_model": {"ground_truth": "1"}} for i in range(3)])
    with pytest.raises(ValueError, match="no 'prompt' column") as excinfo:
        load_task(str(path))
    assert str(path) in _one_line_error(excinfo)


def test_unreadable_parquet_names_the_file(tmp_path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(ValueError, match="not a readable parquet file") as excinfo:
        load_task(str(path))
    assert str(path) in _one_line_error(excinfo)


# --- prompts longer than the model's context -------------------------------------------------
def test_prompt_longer_than_the_context_is_refused_naming_the_problem(tmp_path) -> None:
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model
    from gear_rl.signals import prompt_ids

    train = tmp_path / "train.jsonl"
    _write(train, [_row("What is 1 + 1?", "2", index=0), _row("x" * 200, "1", index=1),
                   _row("What is 2 + 2?", "4", index=2)])
    task = verl_task(train, eval_size=1, seed=0)
    tokenizer = build_tiny_tokenizer()
    model = tiny_random_model(max_position_embeddings=128)
    problems = [*task.train, *task.eval]
    prompts = [(p.id, prompt_ids(tokenizer, p.prompt)) for p in problems]
    long_length = len(prompt_ids(tokenizer, [{"role": "user", "content": "x" * 200}]))
    with pytest.raises(ValueError) as excinfo:
        check_prompt_lengths(prompts, model.config.max_position_embeddings, new_tokens=16,
                             source=task.name)
    message = _one_line_error(excinfo)
    assert "'train/1'" in message and f"{long_length} prompt tokens + 16 new tokens" in message
    assert "max_position_embeddings 128" in message and "1 of 3 prompts" in message

    short = [(i, ids) for i, ids in prompts if i != "train/1"]
    check_prompt_lengths(short, model.config.max_position_embeddings, new_tokens=16,
                         source=task.name)
    check_prompt_lengths(prompts, None, source=task.name)  # the model declares no context
    with pytest.raises(ValueError, match="max_positions must be a positive int"):
        check_prompt_lengths(prompts, 0, source=task.name)
