"""The credit-control study's analysis scripts: scripts/credit_concentration.py (the share of
|A_t| on a response's decisive prefix, up to the end of its first number), credit_on_checkpoints.py,
credit_control_verdict.py and first_number_modes.py, checked on hand-made inputs and the committed
report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gear_rl.stats import verdict

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


CHECK_SETTINGS = {"groups": 16, "per_group": 2, "trajectories": 12, "continuations": 8,
                  "replicates": 2, "seed": 0, "boundaries": "tokens", "every": 4,
                  "confidence": 0.95, "bootstrap": 2000}


def _check(folder: Path, rows: dict[str, float], ceiling: float, **settings) -> Path:
    """A credit check's output folder holding only the scores and settings the script reads."""
    def score(value: float) -> dict:
        return {"value": value, "low": value - 0.1, "high": value + 0.1, "trajectories": 8,
                "groups": 4}

    folder.mkdir(parents=True)
    (folder / "credit_check.json").write_text(json.dumps({"scores": {
        "rows": [{"label": name, "variant": False,
                  "scores": {"first": {"spearman": score(value)}}}
                 for name, value in rows.items()]
        + [{"label": "mine", "variant": True, "scores": {"first": {"spearman": score(0.9)}}}],
        "ceiling": {"spearman": score(ceiling)}}, "settings": {**CHECK_SETTINGS, **settings}}))
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
    # the committed checks of both tasks (products_first's gear-s1 scored one prompt group: its
    # values have no interval, which used to end the script with a TypeError)
    for task in ("products_work", "products_first"):
        committed = sorted((SCRIPT.parents[1] / "results/credit_check/credit_control" / task)
                           .glob("*-s1"))
        done = subprocess.run([sys.executable, str(ON_CHECKPOINTS), *map(str, committed)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert "(no interval, 1 group)" in done.stdout
    assert lines[-1].startswith("Every check: groups=16, per_group=2, trajectories=12, ")
    assert lines[-1].endswith("confidence=0.95, bootstrap=2000 (95% intervals over prompt groups).")
    # a check judged otherwise (another confidence, or other settings) is not mixed in
    for change, named in (({"confidence": 0.9}, "confidence is 0.95 in"),
                          ({"continuations": 4}, "continuations is 8 in")):
        odd = _check(tmp_path / f"odd{len(named)}-{next(iter(change))}" / "gear-s1", rows, 0.5,
                     **change)
        refused = subprocess.run([sys.executable, str(ON_CHECKPOINTS), str(spo), str(odd)],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and named in refused.stderr, refused.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([sys.executable, str(ON_CHECKPOINTS), str(empty)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no credit_check.json in" in refused.stderr


VERDICT = SCRIPT.parent / "credit_control_verdict.py"


def _study(diffs: dict[str, float], contrasts: dict[tuple[str, str], float],
           below: dict[str, list[int]] | None = None, seeds: int = 5) -> dict:
    """A study.json holding only what the verdict reads: each method's paired difference from
    grpo and the contrasts, each with an interval of +-0.05 and an MDD of 0.1."""
    def versus(value: float) -> dict:
        low, high = value - 0.05, value + 0.05
        return {"difference": value, "low": low, "high": high, "mdd": 0.1,
                "verdict": verdict(low, high)}

    below = below or {}
    methods = [{"key": "grpo", "seeds": list(range(seeds)), "unfinished": [], "versus": None,
                "ended_below_start": below.get("grpo", [])}]
    methods += [{"key": key, "seeds": list(range(seeds)),
                 "unfinished": [f"t/{key}-s{s}" for s in range(seeds, 5)],
                 "versus": versus(value), "ended_below_start": below.get(key, [])}
                for key, value in diffs.items()]
    task = {"key": "products", "label": "t", "methods": methods, "k": 4, "final_step": 10,
            "contrasts": [{"key": key, "against": against, "versus": versus(value)}
                          for (key, against), value in contrasts.items()]}
    return {"spec": "studies/x.yaml", "baseline": "grpo", "metric": "mean@k",
            "statistics": {"confidence": 0.95}, "tasks": [task, {**task, "key": "products_work"}]}


def _verdict(tmp_path: Path, study: dict) -> str:
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    done = subprocess.run([sys.executable, str(VERDICT), str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_credit_control_verdict_applies_each_branch(tmp_path: Path) -> None:
    base = {"spo_chain": 0.0, "vineppo": 0.0, "gear": 0.0, "gear_mp": 0.0, "grpo_tokens": 0.2}
    against = {("spo_chain", "grpo_tokens"): -0.2, ("vineppo", "grpo_tokens"): -0.2,
               ("gear_mp", "gear"): 0.0}
    out = _verdict(tmp_path, _study(base, against))
    assert out.count("**Verdict: credit does not limit learning here.**") == 2
    assert "**Decision: the default stays" in out  # not better anywhere, no collapsed seed
    # H1 through spo_chain (+0.10, [+0.05, +0.15]); gear +0.08 inside it and above 0
    out = _verdict(tmp_path, _study({**base, "spo_chain": 0.1, "gear": 0.08}, against))
    assert "H1: spo_chain vs grpo: +0.100 [+0.050, +0.150]: **holds**" in out
    assert out.count("**Verdict: credit limits learning, and GEAR finds it.**") == 2
    # gear's interval includes 0
    out = _verdict(tmp_path, _study({**base, "vineppo": 0.1, "gear": 0.03}, against))
    assert "**Verdict: credit limits learning, GEAR does not find it.**" in out
    # gear beyond noise but above the Monte-Carlo interval: a case the rules do not name
    out = _verdict(tmp_path, _study({**base, "spo_chain": 0.1, "gear": 0.3}, against))
    assert "a case the rules do not name" in out
    # H2 alone (spo_chain beats grpo_tokens beyond noise) still compares gear with grpo
    out = _verdict(tmp_path, _study(base, {**against, ("spo_chain", "grpo_tokens"): 0.1}))
    assert "H2: spo_chain vs grpo_tokens: +0.100 [+0.050, +0.150]: **holds**" in out
    assert "GEAR does not find it" in out
    # step 5's task adds the share of the gain gear captures; a null there says "even where"
    step5 = _study({**base, "spo_chain": 0.1, "gear": 0.08}, against)
    step5["tasks"][1]["key"] = "products_first"
    out = _verdict(tmp_path, step5)
    assert out.count("share of spo_chain's gain that gear captures") == 1
    assert "captures (point estimates, the file's step-5 reading): 0.80" in out
    step5 = _study(base, against)
    step5["tasks"][1]["key"] = "products_first"
    assert "here, even where the truth concentrates" in _verdict(tmp_path, step5)


def test_credit_control_verdict_reads_only_the_registered_reading(tmp_path: Path) -> None:
    """The rules are written for held-out Mean@4, 95% intervals, against grpo: a report judged
    otherwise (the study file's metric, confidence, baseline or k changed) is refused, naming
    it; a registration's amendments are printed above the verdicts."""
    base = {"spo_chain": 0.0, "vineppo": 0.0, "gear": 0.0, "gear_mp": 0.0, "grpo_tokens": 0.2}
    against = {("spo_chain", "grpo_tokens"): -0.2, ("vineppo", "grpo_tokens"): -0.2,
               ("gear_mp", "gear"): 0.0}
    path = tmp_path / "study.json"
    for change, named in ((lambda s: s.update(metric="pass@k"), "metric 'pass@k'"),
                          (lambda s: s.update(statistics={"confidence": 0.9}),
                           "confidence 0.9"),
                          (lambda s: s.update(baseline="gear"), "baseline 'gear'"),
                          (lambda s: s["tasks"][1].update(k=8), "k [4, 8]")):
        study = _study(base, against)
        change(study)
        path.write_text(json.dumps(study))
        done = subprocess.run([sys.executable, str(VERDICT), str(path)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and named in done.stderr, done.stderr
        assert "another reading than the one the file's rules are registered for" in done.stderr
    study = _study(base, against)
    study["registration"] = {"amendments": [{"date": "2026-12-07", "reason": "a typo",
                                             "changes": {"analysis.top_tokens": {}}}]}
    out = _verdict(tmp_path, study)
    assert "records 1 amendment(s)" in out and "- 2026-12-07: a typo (analysis.top_tokens)" in out


def test_credit_control_verdict_gear_default(tmp_path: Path) -> None:
    base = {"spo_chain": 0.0, "vineppo": 0.0, "gear": 0.0, "gear_mp": 0.0, "grpo_tokens": 0.0}
    against = {("spo_chain", "grpo_tokens"): 0.0, ("vineppo", "grpo_tokens"): 0.0}
    # a collapsed gear seed that gear_mp does not share, and gear_mp not worse: replaced
    out = _verdict(tmp_path, _study(base, {**against, ("gear_mp", "gear"): -0.05},
                                    below={"gear": [2], "gear_mp": [3]}))
    assert "gear's collapsed seeds that gear_mp's are not: 2" in out
    assert "**Decision: gear_mp replaces gear as the default" in out
    # the same collapse, but gear_mp below gear by more than the MDD (0.1): the default stays
    out = _verdict(tmp_path, _study(base, {**against, ("gear_mp", "gear"): -0.15},
                                    below={"gear": [2]}))
    assert "**Decision: the default stays" in out
    # both collapse on the same seed: no advantage; interval above 0 instead: replaced
    out = _verdict(tmp_path, _study(base, {**against, ("gear_mp", "gear"): 0.0},
                                    below={"gear": [2], "gear_mp": [2]}))
    assert "**Decision: the default stays" in out
    out = _verdict(tmp_path, _study(base, {**against, ("gear_mp", "gear"): 0.08}))
    assert "**Decision: gear_mp replaces gear" in out
    # unfinished seeds: pending, with the cells left
    out = _verdict(tmp_path, _study(base, {**against, ("gear_mp", "gear"): 0.08}, seeds=3))
    assert "Pending:" in out and "t/gear_mp-s4" in out and "Decision" not in out


def test_credit_control_verdict_on_the_committed_report() -> None:
    # the default task's 30 cells are final: its verdict is the one docs/results.md states
    report = SCRIPT.parents[1] / "results" / "study" / "credit_control" / "study.json"
    done = subprocess.run([sys.executable, str(VERDICT), str(report)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    products = done.stdout.split("### `products`", 1)[1].split("###", 1)[0]
    assert "**Verdict: credit does not limit learning here.**" in products
    assert "**holds**" not in products


MODES = SCRIPT.parent / "first_number_modes.py"


def test_first_number_modes_on_hand_made_records(tmp_path: Path) -> None:
    """Each sample's first number is classed against its own question's factors: one sample of
    each kind per problem gives a quarter each; a cell without summary.json is left out."""
    import re

    import yaml

    from gear_rl.tasks import load_task

    config = {"task": "products", "task_options": {"answer_rule": "first_number"},
              "train_size": 16, "eval": {"size": 16}}
    problems = load_task("products", options=config["task_options"], train_size=16,
                         eval_size=16, seed=0).eval
    records = []
    for problem in problems:
        a, b = map(int, re.search(r"(\d+) \* (\d+)", problem.prompt[-1]["content"]).groups())
        product = int(problem.answer)
        if len({a, b, product}) == 3:
            records.append({"id": problem.id, "answer": problem.answer,
                            "extracted": [str(product), str(a), str(b), None],
                            "rewards": [1.0, 0.0, 0.0, 0.0]})
    assert records
    cells = tmp_path / "cells" / "products_first"
    for name, finished in (("grpo-s0", True), ("gear-s0", False)):
        (cells / name / "eval_records").mkdir(parents=True)
        (cells / f"{name}.yaml").write_text(yaml.safe_dump(config))
        (cells / name / "eval_records" / "step-000002.json").write_text(json.dumps(
            {"step": 2, "k": 4, "seed": 1, "records": records}))
        if finished:
            (cells / name / "summary.json").write_text("{}")
    done = subprocess.run([sys.executable, str(MODES), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| grpo-s0 | 2 | 0.250 | 0.25 | 0.25 | 0.25 | 0.25 |" in done.stdout
    assert "gear-s0" not in done.stdout


def test_first_number_modes_on_the_committed_study() -> None:
    """On the committed cells: a policy that restates the question scores what GRPO's seed-4
    cell scored, and that cell writes the first factor first in 83% of its samples."""
    study = SCRIPT.parents[1] / "results" / "study" / "credit_control"
    done = subprocess.run([sys.executable, str(MODES), str(study)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "always writes the first factor first scores 0.172" in done.stdout
    assert "| grpo-s4 | 10 | 0.172 | 0.17 | 0.83 | 0.00 | 0.00 |" in done.stdout
