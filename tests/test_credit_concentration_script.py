"""scripts/credit_concentration.py: the share of |A_t| on a response's decisive prefix (up to
the end of its first number), checked on hand-made credit-check trajectories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "credit_concentration.py"


def test_shares_of_the_decisive_prefix(tmp_path: Path) -> None:
    # "The answer is 56. Because ...": the prefix is 4 tokens ("The", " answer is", " 5", "6")
    first = {"tokens": ["The", " answer is", " 5", "6", ".", " Because", " so"],
             "mask": [1, 1, 1, 1, 1, 1, 1],
             "mc_advantage": [0.0, 0.1, 0.3, 0.4, 0.0, 0.1, -0.1],
             "advantages": {"grpo": [0.5] * 7}}
    # no number at all: left out; an observation token (mask 0) never counts
    second = {"tokens": ["no", " number"], "mask": [1, 1], "mc_advantage": [0.2, 0.2],
              "advantages": {"grpo": [0.5, 0.5]}}
    third = {"tokens": ["7", " x", " 8", " ok"], "mask": [1, 1, 0, 1],
             "mc_advantage": [0.5, 0.25, 9.0, 0.25], "advantages": {"grpo": [-1.0] * 4}}
    path = tmp_path / "credit_check.json"
    path.write_text(json.dumps({"trajectories": [first, second, third]}))
    done = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2 of 3 trajectories contain a number" in done.stdout
    rows = {line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:4]]
            for line in done.stdout.splitlines() if line.startswith("| ") and "signal" not in line}
    # tokens: (4 + 1) of (7 + 3) policy tokens; per trajectory 4/7 and 1/3
    assert rows["policy tokens (uniform credit)"] == [0.5, round((4 / 7 + 1 / 3) / 2, 3)]
    # truth: (0.8 + 0.5) of (1.0 + 1.0); per trajectory 0.8 and 0.5
    assert rows["mc_advantage"] == [0.65, 0.65]
    # GRPO: uniform within a trajectory, so per trajectory the token shares; pooled weighed by
    # each trajectory's |A|: (0.5 * 4 + 1 * 1) / (0.5 * 7 + 1 * 3)
    assert rows["grpo"] == [round(3 / 6.5, 3), round((4 / 7 + 1 / 3) / 2, 3)]


ON_CHECKPOINTS = SCRIPT.parent / "credit_on_checkpoints.py"


def _check(folder: Path, rows: dict[str, float], ceiling: float) -> Path:
    """A credit check's output folder holding only the scores the script reads."""
    def score(value: float) -> dict:
        return {"value": value, "low": value - 0.1, "high": value + 0.1, "trajectories": 8,
                "groups": 4}

    folder.mkdir(parents=True)
    (folder / "credit_check.json").write_text(json.dumps({"scores": {
        "rows": [{"label": name, "variant": False,
                  "scores": {"first": {"spearman": score(value)}}}
                 for name, value in rows.items()]
        + [{"label": "mine", "variant": True, "scores": {"first": {"spearman": score(0.9)}}}],
        "ceiling": {"spearman": score(ceiling)}}}))
    return folder


def test_credit_on_checkpoints_marks_each_cells_own_credit(tmp_path: Path) -> None:
    rows = {"grpo": 0.0, "spo_chain": 0.4, "vineppo": 0.25, "gear": -0.05}
    spo = _check(tmp_path / "spo_chain-s1", rows, 0.7)
    mp = _check(tmp_path / "gear_mp-s1", rows, 0.6)
    done = subprocess.run([sys.executable, str(ON_CHECKPOINTS), str(spo), str(mp)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("| policy (cell) | trajectories (groups) | noise ceiling | grpo | "
                        "spo_chain | vineppo | gear |")
    # the cell's own estimator in bold; gear_mp's own credit is gear's row
    assert lines[2] == ("| spo_chain-s1 | 8 (4) | +0.70 [+0.60, +0.80] | +0.00 [-0.10, +0.10] | "
                        "**+0.40 [+0.30, +0.50]** | +0.25 [+0.15, +0.35] | "
                        "-0.05 [-0.15, +0.05] |")
    assert lines[3].startswith("| gear_mp-s1 | 8 (4) | +0.60 [+0.50, +0.70] |")
    assert lines[3].endswith("| **-0.05 [-0.15, +0.05]** |")
    assert "mine" not in done.stdout  # variants are not the cell's methods
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([sys.executable, str(ON_CHECKPOINTS), str(empty)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no credit_check.json in" in refused.stderr
