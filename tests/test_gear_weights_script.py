"""scripts/gear_weights_by_sign.py: GEAR's weights per hypothetical outcome sign on logged
samples, checked on hand-made trajectories."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gear_weights_by_sign.py"


def _run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(run_dir), *extra],
                          capture_output=True, text=True, timeout=120)


def _write_run(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir()
    # recorded before mean_preserving became GEAR's default: read as False, what it trained with
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"estimator": "gear", "credit": {}}))
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_degenerate_segment_halves_successes_and_raises_failures(tmp_path: Path) -> None:
    # the first token has the largest divergence (n = 1) and no later entropy exceeds 1.5x the
    # first's: one segment over everything with u = 1, so W = 0.5 on success, 1.5 on failure
    plain = {"tokens": ["a", "b", "c", "d"], "mask": [1, 1, 1, 1],
             "divergence": [2.0, 0.1, 0.0, 0.3], "entropy": [1.0, 1.2, 1.4, 1.1]}
    # a tool call: ```python ... ``` (policy), its output (observation, mask 0), an answer
    # whose token alone has divergence
    called = {"tokens": ["```python", "\nprint(6*7)", "\n```", "\n```output\n42\n```\n", "42"],
              "mask": [1, 1, 1, 0, 1], "divergence": [0.0, 0.0, 0.0, 0.0, 1.0],
              "entropy": [1.0, 1.0, 1.0, 1.0, 1.0]}
    run = tmp_path / "run"
    _write_run(run, [plain, called])
    done = _run(run)
    assert done.returncode == 0, done.stderr
    out = {m[1]: float(m[2]) for m in re.finditer(r"mean W if (.+?)\s+([\d.]+)\s+\(n=",
                                                    done.stdout)}
    # called: n = [0, 0, 0, 1] over its policy tokens; the only segment opens at the last
    # token, so u = n: W = 1.5 - n on success, 0.5 + n on failure
    assert out["success: trajectories without"] == 0.5
    assert out["failure: trajectories without"] == 1.5
    assert out["success: trajectories with a tool call"] == (1.5 * 3 + 0.5) / 4
    assert out["failure: trajectories with a tool call"] == (0.5 * 3 + 1.5) / 4
    assert out["success: tokens inside a call"] == 1.5  # the three call tokens
    assert out["failure: tokens inside a call"] == 0.5
    # mean-preserving: every trajectory's mean W is 1 by construction
    done = _run(run, "credit.mean_preserving=true")
    assert re.search(r"success: every trajectory\s+1\.000", done.stdout)
    assert re.search(r"failure: every trajectory\s+1\.000", done.stdout)
    assert _run(run, "lambda_kl=0.2").returncode == 2  # only credit.* overrides


def test_a_run_without_divergence_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, [{"tokens": ["a"], "mask": [1], "divergence": None, "entropy": [1.0]}])
    done = _run(run)
    assert done.returncode == 2 and "no logged divergence" in done.stderr
