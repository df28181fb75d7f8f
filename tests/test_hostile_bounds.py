"""Resource bounds (issue 56): every knob that sizes memory is checked at config time against
what the machine has (``gear_rl.dataclass_config.check_memory``), naming its keys, before
anything is allocated; a YAML document whose aliases expand past a bound is refused where it is
read (config files, overrides, study specs, a run's recorded config); an error message never
formats a user's value whole (``gear_rl.dataclass_config.shown``); and importing gear-rl bounds
oneDNN's primitive cache, whose per-shape kernels otherwise grow a bf16 run's memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gear_rl.cli import main
from gear_rl.dataclass_config import (
    MAX_YAML_VALUES,
    SHOWN_CHARS,
    machine_memory,
    parse_overrides,
    shown,
)
from gear_rl.train.config import load_config

STUDY = Path(__file__).resolve().parents[1] / "studies" / "default.yaml"
HUGE = 10**12  # of anything, more than any machine holds at the floors' byte counts


@pytest.mark.parametrize(("overrides", "keys"), [
    (["estimator=spo_chain", "credit.mc_samples=1000000000"],
     "credit.mc_samples x rollout.prompts_per_step"),
    (["estimator=vineppo", f"credit.mc_samples={HUGE}"],
     "credit.mc_samples x rollout.prompts_per_step"),
    ([f"rollout.samples_per_prompt={HUGE}"],
     "rollout.prompts_per_step x rollout.samples_per_prompt x rollout.max_new_tokens"),
    ([f"rollout.prompts_per_step={HUGE}"], "rollout.prompts_per_step x"),
    ([f"rollout.max_new_tokens={HUGE}"], "x rollout.max_new_tokens ="),
    ([f"agent.max_response_tokens={HUGE}"], "x agent.max_response_tokens ="),
    ([f"eval.size={HUGE}"], "eval.size x eval.k x eval.max_new_tokens"),
    ([f"eval.k={HUGE}"], "eval.size x eval.k x eval.max_new_tokens"),
    ([f"eval.max_new_tokens={HUGE}"], "eval.size x eval.k x eval.max_new_tokens"),
    ([f"train_size={HUGE}"], "train_size="),
    ([f"agent.sandbox_workers={HUGE}"], "agent.sandbox_workers="),
])
def test_a_knob_that_sizes_memory_past_the_machine_is_refused_naming_it(
        overrides: list[str], keys: str) -> None:
    with pytest.raises(ValueError, match="GB of memory") as caught:
        load_config(None, ["model=tiny-random", *overrides])
    message = str(caught.value)
    assert keys in message and "this machine has" in message, message


def test_the_bound_is_the_machines_memory(monkeypatch) -> None:
    """A setting that fits the machine passes; the same setting on a machine with less memory
    (a container's limit, ``GEAR_RL_MEMORY_BYTES``) is refused."""
    assert machine_memory() is not None
    settings = ["model=tiny-random", "rollout.samples_per_prompt=4096"]  # 33 MB of tokens
    load_config(None, settings)
    monkeypatch.setenv("GEAR_RL_MEMORY_BYTES", str(10**7))
    with pytest.raises(ValueError, match=r"this machine has 0\.0 GB"):
        load_config(None, settings)


def test_the_cli_refuses_a_billion_mc_samples_at_once(tmp_path: Path) -> None:
    """The example: ``credit.mc_samples=1000000000`` ran 90 s into an OOM kill at 23.5 GB;
    it is now one line, in the time the CLI takes to start, and nothing is written."""
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gear_rl.cli", "train", "model=tiny-random",
         "estimator=spo_chain", "credit.mc_samples=1000000000", f"out={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr
    assert "credit.mc_samples x rollout.prompts_per_step = 1,000,000,000 x 4" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "run").exists()
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("key", ["continuations", "replicates", "groups", "bootstrap"])
def test_the_credit_check_bounds_its_sizes(key: str, tmp_path: Path, capsys) -> None:
    assert main(["credit-check", "model=tiny-random", f"{key}={HUGE}",
                 f"out={tmp_path / 'cc'}"]) == 2
    err = capsys.readouterr().err
    assert key in err and "GB of memory" in err, err
    assert not (tmp_path / "cc").exists()


def _bomb(key: str, leaf: str = '"x"') -> str:
    """Nine nested aliases of nine items under ``key``: 387 million values once expanded."""
    lines = [f"a0: &a0 [{', '.join([leaf] * 9)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    lines.append(f"{key}: [{', '.join(['*a8'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("key", ["plugins", "instruction", "agent.sandbox_mounts",
                                 "task_options.x"])
def test_a_yaml_alias_bomb_is_refused_where_it_is_read(key: str, tmp_path: Path) -> None:
    """The 334-byte bomb passed parsing and then its type error formatted 3 GB; a config file
    is now refused as it is read, in the CLI's start-up time."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(key))
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gear_rl.cli", "train", str(path),
                             "model=tiny-random", f"out={tmp_path / 'run'}"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"is refused: it expands to more than {MAX_YAML_VALUES:,} values" in result.stderr
    assert len(result.stderr) < 1000
    assert time.monotonic() - start < 120


def test_alias_bombs_in_overrides_study_specs_and_recorded_configs(tmp_path: Path,
                                                                   capsys) -> None:
    flow = ("&a [x, x, x, x, x, x, x, x, x]", )
    item = flow[0]
    for level in "bcdefgh":
        item = f"&{level} [{', '.join([item] + ['*' + chr(ord(level) - 1)] * 8)}]"
    with pytest.raises(ValueError, match="expands to more than"):
        parse_overrides([f"plugins={item}"])
    assert main(["train", "model=tiny-random", f"plugins={item}"]) == 2
    assert "expands to more than" in capsys.readouterr().err

    spec = tmp_path / "study.yaml"
    spec.write_text(_bomb("methods"))
    assert main(["study", str(spec)]) == 2
    assert f"study spec '{spec}' is refused" in capsys.readouterr().err

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(_bomb("plugins"))
    assert main(["eval", str(run)]) == 2
    assert "config.yaml' is refused" in capsys.readouterr().err


def test_an_anchor_holding_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expands to more than"):
        parse_overrides(["plugins=&a [x, *a]"])


VALUES = {
    "long string": lambda: "x" * 10**6,
    "expanded list": lambda: [["y" * 1000] * 1000] * 1000,  # shared references
    "long integer": lambda: 10**5000,  # past Python's int-to-text limit (4300 digits)
}


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_shown_bounds_the_value_and_the_work(kind: str) -> None:
    value = VALUES[kind]()
    start = time.monotonic()
    text = shown(value)
    assert len(text) <= SHOWN_CHARS + 40, text
    assert time.monotonic() - start < 1


@pytest.mark.parametrize("argv", [
    ["train", "model=tiny-random", "precision=" + "p" * 10**5],
    ["train", "model=tiny-random", "instruction=[" + ", ".join(["zz"] * 10**4) + "]"],
    ["train", "model=tiny-random", "estimator=gear", "credit.normalize=" + "n" * 10**5],
    ["train", "model=tiny-random", "agent.sandbox_mounts=[" + "/" + "m" * 10**5 + "]"],
    ["credit-check", "model=tiny-random", "split=" + "s" * 10**5],
    ["eval", "model=tiny-random", "records=" + "r" * 10**5],
])
def test_an_error_about_a_huge_value_stays_short(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert 0 < len(err) < 1500, err[:300]


def test_importing_gear_rl_bounds_onednns_primitive_cache() -> None:
    """bf16 autocast on a CPU compiles a oneDNN kernel per shape and keeps up to 1024 of them:
    a run's memory then grew about 1 MB a step. gear-rl sets a bounded cache before torch
    starts oneDNN; a setting of the user's wins."""
    code = "import os, gear_rl.cli; print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))"
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    from gear_rl import ONEDNN_PRIMITIVE_CACHE

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout.strip()
    assert out == str(ONEDNN_PRIMITIVE_CACHE)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "3"}, timeout=120,
                         check=True).stdout.strip()
    assert out == "3"
