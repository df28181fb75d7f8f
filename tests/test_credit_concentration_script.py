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
