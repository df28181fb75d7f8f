"""Resume: a run killed mid-way (SIGKILL, in a real subprocess) and continued with
``resume=RUN_DIR`` logs exactly the metrics of an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import kill_when
from gear_rl.train.records import is_measurement

ARGS = [
    "model=tiny-random", "task=arithmetic", "train_size=64", "estimator=gear",
    "loss.opsd_coef=0.5", "steps=10", "seed=3", "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=4", "rollout.max_new_tokens=8", "eval.size=4", "eval.k=1",
    "eval.max_new_tokens=4", "eval.every=4", "log.checkpoint_every=2", "log.progress=false",
    "log.report_to=none", "optim.lr=1e-3", "threads=1",
]
# a multi-turn environment: every turn's sampling reuses the previous turn's KV cache
# (agent.reuse_kv_cache, the default), which lives within one rollout
SOKOBAN = [a for a in ARGS if not a.startswith(("task=", "train_size="))] + [
    "task=sokoban", "train_size=16", "agent.max_turns=3", "agent.max_new_tokens_per_turn=4",
    "agent.max_response_tokens=300",
]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from gear_rl.cli import main; sys.exit(main())",
            "train", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_measurement(k)}
            for r in records]


@pytest.mark.slow
@pytest.mark.parametrize("args", [ARGS, SOKOBAN], ids=["arithmetic", "sokoban"])
def test_killed_run_resumes_to_identical_metrics(tmp_path, args: list[str]) -> None:
    full = tmp_path / "full"
    subprocess.run(_cli(*args, f"out={full}"), check=True, env=_env(), timeout=600,
                   capture_output=True)

    broken = tmp_path / "broken"
    process = subprocess.Popen(_cli(*args, f"out={broken}"), env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(process, lambda: max((r["step"] for r in _records(broken)), default=0) >= 5,
              timeout=600)
    killed_at = max(r["step"] for r in _records(broken))
    assert 5 <= killed_at < 10

    resumed = subprocess.run(_cli(f"resume={broken}"), env=_env(), timeout=600,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = _comparable(_records(full)), _comparable(_records(broken))
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(11))
    assert got == expected
    assert (broken / "checkpoints" / "step-000010").is_dir()


def test_resume_refuses_changed_settings(tmp_path) -> None:
    from gear_rl.train.resume import resume_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\nsteps: 3\n")
    assert resume_config(run, {"steps": 5}).steps == 5
    with pytest.raises(ValueError, match="cannot change"):
        resume_config(run, {"estimator": "grpo"})
    with pytest.raises(ValueError, match=r"no config\.yaml"):
        resume_config(tmp_path / "missing")
