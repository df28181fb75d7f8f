"""The verl recipe's parts users had to bring: reward functions, the sandbox tool, the data script.

``gear_rl.integrations.verl.rewards`` (loaded by path, as verl loads it), ``...verl.tools``
(built from ``recipes/verl/python_tool.yaml`` by verl's own loader, running real code in the real
sandbox) and ``...verl.data`` (on small files in GSM8K's, MATH's and ToolRL's published layouts,
read back as parquet, by verl's ``RLHFDataset`` and by gear-rl's own loaders).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl.tools.base_tool",
                    reason="verl is not installed (pip install 'gear-rl[verl]')")
pytest.importorskip("verl.utils.reward_score", reason="verl is not installed")

import pyarrow.parquet as pq
import yaml
from omegaconf import OmegaConf
from verl.tools.tool_registry import initialize_tools_from_config
from verl.trainer.ppo.reward import get_custom_reward_fn

from gear_rl.integrations.verl import data as verl_data
from gear_rl.integrations.verl import rewards
from gear_rl.integrations.verl.tools import PythonSandboxTool, SandboxToolConfig
from gear_rl.tasks.toolrl import toolrl_task
from gear_rl.tasks.verl_data import verl_task

REPO = Path(__file__).resolve().parents[1]
REWARDS_FILE = REPO / "src" / "gear_rl" / "integrations" / "verl" / "rewards.py"
TOOL_YAML = REPO / "recipes" / "verl" / "python_tool.yaml"
COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def verl_reward_fn(name: str, **reward_kwargs: Any):
    """The reward function as verl 0.9.1 builds it: loaded from the file's path, kwargs merged."""
    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(REWARDS_FILE), "name": name, "reward_kwargs": reward_kwargs}}})
    return get_custom_reward_fn(config)


def call(fn, solution: str, ground_truth: Any, data_source: str = "gear_rl/math"):
    """As verl's reward managers call it: keyword arguments only."""
    return fn(data_source=data_source, solution_str=solution, ground_truth=ground_truth,
              extra_info={"index": 0})


# --- math reward ----------------------------------------------------------------------------
MATH_CASES = [  # (ground truth, response, expected reward)
    ("72", "48 + 24 = 72, so she sold \\boxed{72} clips.", 1.0),
    ("72", "She sold 72 clips in all.", 1.0),                      # last-number fallback
    ("\\frac{1}{2}", "The probability is \\boxed{\\frac{2}{4}}.", 1.0),
    ("0.5", "so \\boxed{1/2}", 1.0),
    ("72", "She sold \\boxed{71} clips.", 0.0),
    ("72", "I do not know.", 0.0),
    ("72", "", 0.0),                                               # malformed from here on
    ("72", "\\boxed{", 0.0),
    ("72", "\\boxed{}", 0.0),
    ("72", "\\frac{{{{{{ \\sqrt{ }}}}}}}}}} \\left( $$ $", 0.0),
    ("72", "\x00\udcff" + "(" * 5000, 0.0),
]


def _gear_rl_score(tmp_path: Path, gold: str, response: str) -> float:
    """What ``gear-rl train`` gives ``response`` on a verl-layout file whose ground truth is
    ``gold``."""
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}],
             "reward_model": {"ground_truth": gold}} for i in range(2)]
    path = tmp_path / "gold.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    task = verl_task(path, eval_size=1)
    return task.score(task.train[0], response)


@pytest.mark.parametrize(("gold", "response", "expected"), MATH_CASES)
def test_math_reward_equals_gear_rl_train_scorer(tmp_path, gold, response, expected):
    fn = verl_reward_fn("math_verify_reward")
    score = call(fn, response, gold)
    assert isinstance(score, float) and score == expected
    assert score == _gear_rl_score(tmp_path, gold, response)


def test_math_reward_off_the_main_thread_is_the_main_thread_score():
    """verl runs a synchronous reward in an executor thread, where math-verify's signal-based
    timeout cannot run; the score must still be gear-rl's (a fraction that only math-verify
    proves equal, not the last-number fallback)."""
    fn = verl_reward_fn("compute_score")

    async def in_executor() -> list[float]:
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(None, lambda g=g, r=r: call(fn, r, g))
                for g, r, _ in MATH_CASES[:6]]

    assert asyncio.run(in_executor()) == [expected for _, _, expected in MATH_CASES[:6]]


def test_math_reward_scores_the_final_turn_of_a_tool_rollout():
    fn = verl_reward_fn("math_verify_reward")
    rollout = ("I will compute it.\n<tool_call>\n{\"name\": \"python\", \"arguments\": "
               "{\"code\": \"print(6*7)\"}}\n</tool_call>\nuser\n<tool_response>\n42\n"
               "</tool_response>\nassistant\n")
    assert call(fn, rollout + "So the answer is \\boxed{42}.", "42") == 1.0
    assert call(fn, rollout + "Done.", "42") == 0.0          # the answer only in the tool output
    whole = verl_reward_fn("math_verify_reward", final_turn_only=False)
    assert call(whole, rollout + "Done.", "42") == 1.0


@pytest.mark.parametrize(("ground_truth", "response", "expected"), [
    (72, "\\boxed{72}", 1.0),
    (np.int64(72), "\\boxed{72}", 1.0),
    (0.5, "\\boxed{\\frac{1}{2}}", 1.0),
    (["72"], "\\boxed{72}", 1.0),             # a one-element list is read by its element
    (72.0, "\\boxed{72}", 1.0),
    (np.array(["9"], dtype=object), "9", 1.0),
])
def test_math_reward_ground_truth_types(ground_truth, response, expected):
    assert call(verl_reward_fn("math_verify_reward"), response, ground_truth) == expected


@pytest.mark.parametrize(("ground_truth", "message"), [
    ({"answer": "72"}, "dict"),
    (b"72", "bytes"),
    (float("nan"), "finite"),
    (math.inf, "finite"),
    (None, "NoneType"),
    (True, "bool"),
    ([], "empty list"),
    ("   ", "blank"),
    ([["72"]], "list"),
    (["72", "73"], "list of 2 answers"),
])
def test_math_reward_refuses_bad_ground_truths(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        call(verl_reward_fn("math_verify_reward"), "\\boxed{72}", ground_truth)


def test_math_reward_refuses_unknown_kwargs_and_non_text():
    with pytest.raises(ValueError, match=r"unknown keyword.*final_turn"):
        call(verl_reward_fn("math_verify_reward", final_turn=True), "72", "72")
    with pytest.raises(ValueError, match="timeout_s"):
        call(verl_reward_fn("math_verify_reward", timeout_s=0), "72", "72")
    with pytest.raises(ValueError, match="solution_str"):
        call(verl_reward_fn("math_verify_reward"), None, "72")
    # what verl itself adds when a reward model is configured is accepted
    assert rewards.math_verify_reward("s", "72", "72", reward_router_address=None) == 1.0


# --- ToolRL reward --------------------------------------------------------------------------
TOOLRL_GOLD = ("<think>The user wants the weather in Paris.</think>\n<tool_call>\n"
               '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}\n'
               "</tool_call>")
TOOLRL_RESPONSES = {
    "right": TOOLRL_GOLD,
    "right_arguments_key": ("<think>ok</think>\n<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"unit\": \"celsius\", \"city\": \"Paris\"}}\n"
                            "</tool_call>"),
    "wrong_value": TOOLRL_GOLD.replace("Paris", "Lyon"),
    "wrong_tool": TOOLRL_GOLD.replace("get_weather", "get_time"),
    "no_think": TOOLRL_GOLD.split("\n", 1)[1],
    "no_call": "<think>hmm</think>\n<response>It is sunny.</response>",
    "bad_json": "<think>x</think>\n<tool_call>\n{\"name\": get_weather}\n</tool_call>",
    "empty": "",
}


def _toolrl_task_scores(tmp_path: Path, reward_scale: Any) -> dict[str, float]:
    rows = [{"instruction": "You can call get_weather.", "input": f"Weather in Paris? {i}",
             "output": TOOLRL_GOLD} for i in range(2)]
    path = tmp_path / "toolrl.json"
    path.write_text(json.dumps(rows))
    task = toolrl_task(path, eval_size=1, reward_scale=reward_scale)
    return {name: task.score(task.train[0], text) for name, text in TOOLRL_RESPONSES.items()}


def test_toolrl_reward_equals_gear_rl_scorer(tmp_path):
    fn = verl_reward_fn("toolrl_reward")
    paper = _toolrl_task_scores(tmp_path, "paper")
    results = {name: call(fn, text, TOOLRL_GOLD, "gear_rl/toolrl")
               for name, text in TOOLRL_RESPONSES.items()}
    for name, result in results.items():
        assert set(result) == {"score", "format", "correct", "acc"}, name  # same keys every call
        assert result["score"] == pytest.approx(paper[name]), name
        assert result["score"] == pytest.approx(result["format"] + result["correct"]), name
    assert results["right"] == {"score": 4.0, "format": 1.0, "correct": 3.0, "acc": 1.0}
    assert results["right_arguments_key"]["acc"] == 1.0
    assert -3.0 < results["wrong_value"]["correct"] < 3.0 and results["wrong_value"]["acc"] == 0
    assert results["no_think"]["format"] == 0.0 and results["no_think"]["correct"] == 3.0
    assert results["bad_json"]["correct"] == results["no_call"]["correct"] == -3.0
    assert results["empty"] == {"score": -3.0, "format": 0.0, "correct": -3.0, "acc": 0.0}
    unit = _toolrl_task_scores(tmp_path, "unit")
    fn_unit = verl_reward_fn("toolrl_reward", reward_scale="unit")
    for name, text in TOOLRL_RESPONSES.items():
        assert call(fn_unit, text, TOOLRL_GOLD, "gear_rl/toolrl")["score"] == pytest.approx(
            unit[name])


def test_toolrl_reward_survives_json_nested_too_deep():
    result = call(verl_reward_fn("toolrl_reward"),
                  "<think>x</think>\n<tool_call>\n" + "[" * 100_000 + "\n</tool_call>",
                  TOOLRL_GOLD, "gear_rl/toolrl")
    assert result["correct"] == -3.0 and result["acc"] == 0.0


@pytest.mark.parametrize("ground_truth", [
    '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}]',
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}],
    {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}},
    np.array([{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}]),
])
def test_toolrl_reward_reads_json_encoded_gold_calls(ground_truth):
    fn = verl_reward_fn("toolrl_reward")
    for name in ("right", "wrong_value", "wrong_tool", "bad_json"):
        text = TOOLRL_RESPONSES[name]
        assert call(fn, text, ground_truth, "gear_rl/toolrl") == call(
            fn, text, TOOLRL_GOLD, "gear_rl/toolrl"), name


@pytest.mark.parametrize(("ground_truth", "message"), [
    ("the weather is fine", "neither"),
    ([], "no tool call"),
    (["get_weather"], "object"),
    (5, "int"),
    ("<tool_call>\n{not json}\n</tool_call>", "does not parse"),
])
def test_toolrl_reward_refuses_bad_gold(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        call(verl_reward_fn("toolrl_reward"), TOOLRL_GOLD, ground_truth, "gear_rl/toolrl")
    with pytest.raises(ValueError, match="reward_scale"):
        call(verl_reward_fn("toolrl_reward", reward_scale="percent"), TOOLRL_GOLD, TOOLRL_GOLD)


def test_compute_score_dispatches_on_data_source():
    fn = verl_reward_fn("compute_score")
    assert call(fn, TOOLRL_GOLD, TOOLRL_GOLD, "gear_rl/toolrl")["score"] == 4.0
    assert call(fn, "\\boxed{72}", "72", "gear_rl/gsm8k") == 1.0
    assert call(fn, "\\boxed{72}", "72", "openai/gsm8k") == 1.0


def test_verl_reward_manager_scores_and_logs_through_the_function():
    """verl 0.9.1's naive reward manager end to end: decode, call (in its executor thread),
    score and the logged extras."""
    pytest.importorskip("aiohttp", reason="verl's reward loop needs aiohttp "
                                          "(installed in .venv/verl-cpu)")
    import torch
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    class CharTokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(int(i)) for i in ids if int(i) > 0)

    def item(text: str, gold: Any, source: str) -> DataProto:
        ids = torch.zeros(1, 160, dtype=torch.long)
        ids[0, :len(text)] = torch.tensor([ord(c) for c in text])
        return DataProto.from_dict(
            tensors={"responses": ids, "attention_mask": (ids > 0).long()},
            non_tensors={"data_source": np.array([source], dtype=object),
                         "reward_model": np.array([{"ground_truth": gold}], dtype=object),
                         "extra_info": np.array([{}], dtype=object)})

    async def run() -> list[dict]:
        manager = NaiveRewardManager(None, CharTokenizer(), verl_reward_fn("compute_score"))
        return [await manager.run_single(item("so \\boxed{\\frac{2}{4}}", "\\frac{1}{2}",
                                              "gear_rl/math")),
                await manager.run_single(item(TOOLRL_GOLD, TOOLRL_GOLD, "gear_rl/toolrl"))]

    math_out, toolrl_out = asyncio.run(run())
    assert math_out == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
    assert toolrl_out["reward_score"] == 4.0
    assert toolrl_out["reward_extra_info"] == {"score": 4.0, "format": 1.0, "correct": 3.0,
                                               "acc": 1.0}


# --- the sandbox tool -----------------------------------------------------------------------
def _worker_processes() -> list[int]:
    """Live sandbox worker processes started from this process (its children)."""
    me, found = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat[1] == me and stat[0] != "Z" and b"_sandbox_worker.py" in cmdline:
            found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in Path(
            f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]]
        if not alive:
            break
        time.sleep(0.1)
    return alive


def _tool_yaml(tmp_path: Path, **config: Any) -> Path:
    """The recipe's tool config with ``config`` overrides (small pools for a 2-core machine)."""
    spec = yaml.safe_load(TOOL_YAML.read_text())
    spec["tools"][0]["config"].update(config)
    path = tmp_path / "tool.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_recipe_tool_yaml_declares_the_tool():
    spec = yaml.safe_load(TOOL_YAML.read_text())
    [entry] = spec["tools"]
    assert entry["class_name"] == "gear_rl.integrations.verl.tools.PythonSandboxTool"
    function = entry["tool_schema"]["function"]
    assert function["name"] == verl_data.TOOL_NAME
    assert function["parameters"]["properties"]["code"]["type"] == "string"
    assert function["parameters"]["required"] == ["code"]
    SandboxToolConfig.from_mapping(entry["config"])  # every key valid
    assert f"`{verl_data.TOOL_NAME}` tool" in verl_data.TIR_SYSTEM_PROMPT


def test_tool_runs_code_in_the_sandbox(tmp_path):
    [tool] = initialize_tools_from_config(str(_tool_yaml(
        tmp_path, workers=1, timeout_s=2, max_response_chars=300)))
    assert isinstance(tool, PythonSandboxTool) and tool.name == "python"
    assert tool.sandbox is None  # nothing started before the first call

    async def session() -> list[tuple[Any, float, dict]]:
        instance, _ = await tool.create(create_kwargs={"ground_truth": "secret"})
        results = [await tool.execute(instance, {"code": code}) for code in (
            "import sympy\nprint(sympy.factor('x**2 - 1'), 6 * 7)",
            "print('partial')\n1 / 0",
            "import time\ntime.sleep(60)",
            f"print(open({str(Path(__file__))!r}).read())",
            "print('y' * 100000)",
        )]
        results.append(await tool.execute(instance, {"source": "print(1)"}))
        assert await tool.calc_reward(instance) == 0.0
        await tool.release(instance)
        return results

    try:
        ok, error, timeout, private, long, no_code = asyncio.run(session())
    finally:
        tool.close()
    assert ok[0].text == "(x - 1)*(x + 1) 42" and ok[1] == 0.0 and ok[2]["exit_code"] == 0.0
    assert error[0].text.startswith("partial") and "ZeroDivisionError" in error[0].text
    assert error[2]["exit_code"] == 1.0
    assert "timed out after 2 s" in timeout[0].text and timeout[2]["timed_out"] == 1.0
    assert "FileNotFoundError" in private[0].text  # the checkout is not in the sandbox
    assert len(long[0].text) <= 300 and "characters cut" in long[0].text
    assert "'code'" in no_code[0].text and "source" in no_code[0].text


def test_closing_the_tool_leaves_no_worker(tmp_path):
    before = set(_worker_processes())
    [tool] = initialize_tools_from_config(str(_tool_yaml(tmp_path, workers=2)))

    async def one_call(tool: PythonSandboxTool) -> str:
        instance, _ = await tool.create()
        response, _, _ = await tool.execute(instance, {"code": "print(1)"})
        await tool.release(instance)
        return response.text

    assert asyncio.run(one_call(tool)) == "1"
    assert tool.sandbox is not None
    pids = tool.sandbox.worker_pids()
    started = sorted(set(_worker_processes()) - before)
    assert len(started) == 2 and len(pids) == 2
    tool.close()
    tool.close()  # idempotent
    assert _wait_gone(pids + started) == []
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(one_call(tool))

    # dropped without close(): garbage collection stops the workers too
    [tool] = initialize_tools_from_config(str(_tool_yaml(tmp_path, workers=1)))
    assert asyncio.run(one_call(tool)) == "1"
    started = sorted(set(_worker_processes()) - before)
    assert len(started) == 1
    del tool
    gc.collect()
    assert _wait_gone(started) == []


def test_building_tools_for_the_dataset_starts_no_worker(tmp_path):
    """verl's RLHFDataset builds the tools only to measure prompts with their schemas."""
    before = set(_worker_processes())
    tools = initialize_tools_from_config(str(TOOL_YAML))
    assert [t.sandbox for t in tools] == [None]
    assert set(_worker_processes()) == before


@pytest.mark.parametrize(("config", "message"), [
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": float("nan")}, "timeout_s"),
    ({"timeout_s": 10_000}, "timeout_s"),
    ({"memory_mb": 32}, "memory_mb"),
    ({"memory_mb": 512.5}, "memory_mb"),
    ({"workers": "2"}, "workers"),
    ({"workers": True}, "workers"),
    ({"max_output_bytes": 10}, "max_output_bytes"),
    ({"bogus": 1}, "unknown key"),
    ({"hidden": ["relative/path"]}, "hidden"),
    ({"mounts": ["/no/such/path"]}, "mounts"),
    ({"packages": "numpy"}, "packages"),
    ({"require_isolation": "yes"}, "require_isolation"),
])
def test_bad_tool_config_is_refused(tmp_path, config, message):
    with pytest.raises(ValueError, match=message):
        initialize_tools_from_config(str(_tool_yaml(tmp_path, **config)))


def test_tool_config_checks_what_verl_does_not():
    """verl refuses an unknown tool ``type`` itself; the tool refuses it when built directly."""
    with pytest.raises(ValueError, match="'type' must be 'native'"):
        SandboxToolConfig.from_mapping({"type": "mcp"})
    with pytest.raises(ValueError, match="mapping"):
        SandboxToolConfig.from_mapping(["workers", 2])  # type: ignore[arg-type]
    assert SandboxToolConfig.from_mapping(None) == SandboxToolConfig()


def test_tool_schema_without_code_is_refused(tmp_path):
    spec = yaml.safe_load(TOOL_YAML.read_text())
    spec["tools"][0]["tool_schema"]["function"]["parameters"] = {
        "type": "object", "properties": {"source": {"type": "string"}}, "required": ["source"]}
    path = tmp_path / "tool.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="'code'"):
        initialize_tools_from_config(str(path))


# --- the data script ------------------------------------------------------------------------
GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                 "many clips in May. How many clips did Natalia sell altogether?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
               "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"},
    {"question": "What is 1,000 plus 234?", "answer": "1,000 + 234 = 1,234\n#### 1,234"},
    {"question": "A debt of 5 dollars is paid off twice. What is the balance?",
     "answer": "5 - 10 = -5\n#### -5"},
    {"question": "What is 1,000 plus 234?", "answer": "again\n#### 1234"},  # duplicate prompt
]
MATH_ROWS = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "level": "Level 1",
     "type": "Prealgebra", "solution": "$\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$."},
    {"problem": "Solve $x^2 = 4$ for $x > 0$.", "level": "Level 2", "type": "Algebra",
     "solution": "First $x = \\boxed{3}$ is wrong; $x = \\boxed{2}$."},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _read(path: Path) -> list[dict]:
    table = pq.read_table(path)
    assert set(table.column_names) == COLUMNS
    return table.to_pylist()


def _math_sources(root: Path) -> Path:
    """GSM8K's jsonl, MATH's jsonl (lighteval / MATH-500) and an original MATH problem file."""
    _jsonl(root / "gsm8k" / "train.jsonl", GSM8K_ROWS)
    _jsonl(root / "math" / "train.jsonl", MATH_ROWS[:1])
    (root / "math" / "algebra").mkdir(parents=True)
    (root / "math" / "algebra" / "7.json").write_text(json.dumps(MATH_ROWS[1]))
    return root


def test_math_data_from_gsm8k_and_math_layouts(tmp_path):
    src = _math_sources(tmp_path / "src")
    written = verl_data.write_verl_data("math", src, tmp_path / "out", test_fraction=0.25)
    rows = _read(written.train_path) + _read(written.test_path)
    assert (written.train, written.test, written.read, written.duplicates) == (4, 1, 6, 1)
    assert written.layouts == {"gsm8k": 3, "math": 2}
    assert "wrote 4 train rows" in written.summary() and "1 duplicate" in written.summary()
    golds = {row["extra_info"]["question"]: row["reward_model"]["ground_truth"] for row in rows}
    assert golds == {GSM8K_ROWS[0]["question"]: "72", GSM8K_ROWS[1]["question"]: "1234",
                     GSM8K_ROWS[2]["question"]: "-5", MATH_ROWS[0]["problem"]: "\\frac{3}{4}",
                     MATH_ROWS[1]["problem"]: "2"}
    for row in rows:
        assert row["reward_model"]["style"] == "rule" and row["ability"] == "math"
        assert row["data_source"] == verl_data.DATA_SOURCES[row["extra_info"]["layout"]]
        [message] = row["prompt"]
        assert message["role"] == "user"
        assert message["content"] == (row["extra_info"]["question"] + "\n\n"
                                      + verl_data.MATH_INSTRUCTION)
    for path, split in ((written.train_path, "train"), (written.test_path, "test")):
        part = _read(path)
        assert [r["extra_info"]["index"] for r in part] == list(range(len(part)))
        assert {r["extra_info"]["split"] for r in part} == {split}
    nat = next(r for r in rows if r["reward_model"]["ground_truth"] == "72")
    assert nat["extra_info"]["reference_solution"].endswith("72 clips altogether.")
    assert nat["extra_info"]["source"] == f"{src / 'gsm8k' / 'train.jsonl'} line 1"


def test_split_is_deterministic_and_seeded(tmp_path):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(40)]
    src = _jsonl(tmp_path / "gsm8k.jsonl", rows)

    def test_questions(seed: int, out: str) -> list[str]:
        written = verl_data.write_verl_data("math", src, tmp_path / out, seed=seed,
                                            test_fraction=0.2)
        train = {r["extra_info"]["question"] for r in _read(written.train_path)}
        test = [r["extra_info"]["question"] for r in _read(written.test_path)]
        assert len(test) == 8 and len(train) == 32 and not train & set(test)
        return test

    assert test_questions(0, "a") == test_questions(0, "b")
    assert test_questions(0, "a") != test_questions(1, "c")


def test_written_math_data_scores_like_gear_rl_train(tmp_path):
    written = verl_data.write_verl_data("math", _math_sources(tmp_path / "src"),
                                        tmp_path / "out", test_fraction=0.25)
    task = verl_task(written.train_path, eval_path=written.test_path)
    rows = {r["extra_info"]["question"]: r for r in _read(written.train_path)}
    fn = verl_reward_fn("compute_score")
    for problem in task.train:
        row = next(r for q, r in rows.items() if problem.prompt[0]["content"].startswith(q))
        assert problem.answer == row["reward_model"]["ground_truth"]
        assert problem.reference_kind == "answer"  # the recipe's default hint
        for response in (f"\\boxed{{{problem.answer}}}", "\\boxed{-17}"):
            expected = task.score(problem, response)
            assert call(fn, response, row["reward_model"]["ground_truth"],
                        row["data_source"]) == expected
        assert call(fn, f"\\boxed{{{problem.answer}}}", problem.answer) == 1.0


def test_tir_data_offers_the_tool_and_verl_reads_it(tmp_path, monkeypatch):
    import datasets
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    written = verl_data.write_verl_data("tir", _math_sources(tmp_path / "src"),
                                        tmp_path / "out", test_fraction=0.25)
    before = set(_worker_processes())
    dataset = RLHFDataset(
        data_files=[str(written.train_path)], tokenizer=None, processor=None,
        config=OmegaConf.create({"filter_overlong_prompts": False,
                                 "cache_dir": str(tmp_path / "cache"),
                                 "tool_config_path": str(TOOL_YAML)}))
    assert set(_worker_processes()) == before  # the tools were built, no sandbox started
    assert dataset.tool_schemas[0]["function"]["name"] == verl_data.TOOL_NAME
    assert len(dataset) == written.train == 4
    item = dataset[0]
    system, user = item["raw_prompt"]
    assert system == {"role": "system", "content": verl_data.TIR_SYSTEM_PROMPT}
    assert user["role"] == "user" and user["content"].endswith(verl_data.MATH_INSTRUCTION)
    assert item["tools_kwargs"] == {} and item["index"] == 0
    assert item["reward_model"]["ground_truth"] in {"72", "1234", "-5", "\\frac{3}{4}", "2"}


TOOLRL_ROWS = [
    {"instruction": "You can call get_weather(city, unit). Answer with <think> then "
                    "<tool_call> or <response>.",
     "input": "User: What's the weather in Paris, in celsius?", "output": TOOLRL_GOLD},
    {"instruction": "You can call get_weather(city, unit).", "input": "User: thanks!",
     "output": "<think>No call needed.</think>\n<response>You're welcome!</response>"},
    {"instruction": "You can call get_weather(city, unit).", "input": "User: Paris and Rome?",
     "output": "<think>Two calls.</think>\n<tool_call>\n"
               '{"name": "get_weather", "parameters": {"city": "Paris"}}\n'
               '{"name": "get_weather", "parameters": {"city": "Rome"}}\n</tool_call>'},
]


def test_toolrl_data_from_toolrl_json(tmp_path):
    src = tmp_path / "rlla.json"
    src.write_text(json.dumps(TOOLRL_ROWS + TOOLRL_ROWS[:1]))
    written = verl_data.write_verl_data("toolrl", src, tmp_path / "out", test_fraction=0.3)
    assert (written.train, written.test, written.duplicates) == (2, 1, 1)
    rows = _read(written.train_path) + _read(written.test_path)
    by_input = {r["prompt"][-1]["content"]: r for r in rows}
    assert set(by_input) == {row["input"] for row in TOOLRL_ROWS}
    for source in TOOLRL_ROWS:
        row = by_input[source["input"]]
        assert row["prompt"] == [{"role": "system", "content": source["instruction"]},
                                 {"role": "user", "content": source["input"]}]
        assert row["reward_model"] == {"style": "rule", "ground_truth": source["output"]}
        assert row["data_source"] == "gear_rl/toolrl" and row["ability"] == "tool_use"
    first = by_input[TOOLRL_ROWS[0]["input"]]["extra_info"]
    assert first["reference_kind"] == "tool_call"
    assert first["reference"].startswith("<tool_call>") and "<think>" not in first["reference"]
    assert by_input[TOOLRL_ROWS[1]["input"]]["extra_info"]["reference"] == (
        "<response>You're welcome!</response>")
    # gear-rl's own ToolRL task reads the written files and scores them as the verl function
    task = toolrl_task(written.train_path, eval_path=written.test_path, reward_scale="paper")
    fn = verl_reward_fn("compute_score")
    for problem in [*task.train, *task.eval]:
        row = by_input[problem.prompt[-1]["content"]]
        for response in TOOLRL_RESPONSES.values():
            assert call(fn, response, row["reward_model"]["ground_truth"],
                        row["data_source"])["score"] == pytest.approx(
                task.score(problem, response))


def test_separate_test_source_drops_overlapping_training_rows(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    test = _jsonl(tmp_path / "test.jsonl", [GSM8K_ROWS[0], MATH_ROWS[0]])
    written = verl_data.write_verl_data("math", train, tmp_path / "out", test_src=test)
    assert (written.train, written.test) == (2, 2)
    assert written.duplicates == 2  # one repeat within train, one train row repeating a test one
    test_questions = {r["extra_info"]["question"] for r in _read(written.test_path)}
    assert not test_questions & {r["extra_info"]["question"] for r in _read(written.train_path)}


def test_malformed_row_is_refused_naming_file_and_row(tmp_path, capsys):
    bad = {"question": "How many?", "answer": "Some number, no marker."}
    src = _jsonl(tmp_path / "mixed.jsonl", [GSM8K_ROWS[0], bad, MATH_ROWS[0]])
    with pytest.raises(ValueError, match=rf"{src} line 2: fits neither GSM8K's layout"):
        verl_data.write_verl_data("math", src, tmp_path / "out")
    assert not (tmp_path / "out" / "train.parquet").exists()
    assert verl_data.main(["tir", str(src), str(tmp_path / "out")]) == 2
    assert f"{src} line 2" in capsys.readouterr().err
    written = verl_data.write_verl_data("math", src, tmp_path / "out", skip_invalid=True)
    assert (written.train + written.test, written.skipped) == (2, 1)
    unboxed = _jsonl(tmp_path / "math.jsonl", [MATH_ROWS[0], {"problem": "p", "solution": "4"}])
    with pytest.raises(ValueError, match=rf"{unboxed} line 2: .*boxed"):
        verl_data.write_verl_data("math", unboxed, tmp_path / "out")
    toolrl = tmp_path / "toolrl.json"
    toolrl.write_text(json.dumps([TOOLRL_ROWS[0], {"instruction": "x", "input": 3,
                                                   "output": TOOLRL_GOLD}]))
    with pytest.raises(ValueError, match=rf"{toolrl} row 2: 'input' must be a string"):
        verl_data.write_verl_data("toolrl", toolrl, tmp_path / "out")


@pytest.mark.parametrize(("setup", "kwargs", "message"), [
    (lambda d: _jsonl(d / "empty.jsonl", []), {}, "no rows"),
    (lambda d: _jsonl(d / "one.jsonl", GSM8K_ROWS[:1]), {}, "at least 2"),
    (lambda d: _jsonl(d / "two.jsonl", GSM8K_ROWS[:2]), {"test_fraction": 0}, "test_fraction"),
    (lambda d: _jsonl(d / "two.jsonl", GSM8K_ROWS[:2]), {"test_fraction": 1.0},
     "test_fraction"),
    (lambda d: d / "missing.jsonl", {}, "no such file"),
    (lambda d: (d / "empty_dir").mkdir() or d / "empty_dir", {}, "no .json"),
])
def test_bad_inputs_are_refused(tmp_path, setup, kwargs, message):
    with pytest.raises(ValueError, match=message):
        verl_data.write_verl_data("math", setup(tmp_path), tmp_path / "out", **kwargs)
    with pytest.raises(ValueError, match="setting"):
        verl_data.write_verl_data("code", tmp_path, tmp_path / "out")


def test_command_line_says_what_it_wrote(tmp_path):
    src = _math_sources(tmp_path / "src")
    completed = subprocess.run(
        [sys.executable, "-m", "gear_rl.integrations.verl.data", "math", str(src),
         str(tmp_path / "out"), "--test-fraction", "0.25", "--seed", "3"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"math: wrote 4 train rows to {tmp_path / 'out'}")
    assert len(_read(tmp_path / "out" / "train.parquet")) == 4
    assert len(_read(tmp_path / "out" / "test.parquet")) == 1


@pytest.mark.parametrize("setting", verl_data.SETTINGS)
def test_example_data_for_smoke_runs(tmp_path, setting):
    written = verl_data.write_example_data(setting, tmp_path / setting, train_size=12,
                                           eval_size=4, seed=1)
    train, test = _read(written.train_path), _read(written.test_path)
    assert len(train) == written.train >= 8 and len(test) == written.test >= 3
    keys = [json.dumps(r["prompt"]) for r in train + test]
    assert len(set(keys)) == len(keys)  # deduplicated, and no test prompt in training
    fn = verl_reward_fn("compute_score")
    for row in train + test:
        gold = row["reward_model"]["ground_truth"]
        if setting == "toolrl":
            assert row["data_source"] == "gear_rl/toolrl" and row["ability"] == "tool_use"
            assert call(fn, gold, gold, row["data_source"])["acc"] == 1.0
        else:
            assert row["data_source"] == "gear_rl/products"
            assert len(row["prompt"]) == (2 if setting == "tir" else 1)
            assert call(fn, f"so \\boxed{{{gold}}}", gold, row["data_source"]) == 1.0
            assert call(fn, f"so \\boxed{{{int(gold) + 1}}}", gold, row["data_source"]) == 0.0
    again = verl_data.write_example_data(setting, tmp_path / "again", train_size=12,
                                         eval_size=4, seed=1)
    assert _read(again.train_path) == train and _read(again.test_path) == test  # seeded
    with pytest.raises(ValueError, match="train_size"):
        verl_data.write_example_data(setting, tmp_path / "bad", train_size=0)
