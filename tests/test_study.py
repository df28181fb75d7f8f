"""``gear-rl study``: the paired statistics against hand-computed values and the exact bootstrap
on small fixed tables, the verdict wording, the spec's checks, the refusal to compare cells whose
settings differ, the paired evaluation draws and records, and (slow) a real study killed with
SIGKILL mid-way and run again, against an uninterrupted one."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import kill_when
from gear_rl.cli import main
from gear_rl.dataclass_config import flatten_keys
from gear_rl.rundir import RunDir, cpu_model, machine_label
from gear_rl.stats import (
    bootstrap_mean,
    minimum_detectable,
    paired_difference,
    seed_test,
    verdict,
)
from gear_rl.study import analyze_study, parse_spec, write_study
from gear_rl.study.report import cell_machines, mixed_seeds
from gear_rl.study.runner import (
    default_parallelism,
    mixed_seed_warnings,
    plan_cells,
    resolve_parallelism,
    select_cells,
)
from gear_rl.train.config import config_to_dict, load_config
from gear_rl.train.records import is_measurement
from gear_rl.train.runtime import resolves_to_bf16

pytestmark = pytest.mark.usefixtures("one_thread")

# Two seeds x three problems: per-problem Mean@k of a method and of the baseline.
METHOD = [[1.0, 0.5, 0.0], [1.0, 1.0, 0.5]]
BASELINE = [[0.5, 0.5, 0.0], [1.0, 0.5, 0.0]]


def _exact_bootstrap(method, baseline, *, paired: bool) -> tuple[float, float]:
    """Mean and standard deviation of the ideal bootstrap distribution of the difference of
    means, by enumerating every equally likely draw (seeds and problems with replacement)."""
    method, baseline = np.asarray(method), np.asarray(baseline)
    seeds, problems = method.shape
    seed_draws = list(itertools.product(range(seeds), repeat=seeds))
    problem_draws = list(itertools.product(range(problems), repeat=problems))
    values = []
    for ps in problem_draws:
        for sm in seed_draws:
            for sb in ([sm] if paired else seed_draws):
                values.append(method[np.ix_(sm, ps)].mean() - baseline[np.ix_(sb, ps)].mean())
    values = np.array(values)
    return float(values.mean()), float(values.std())


def _ideal_variance(method, baseline) -> float:
    """The paired bootstrap's variance in closed form: with resampling weights ``w`` (seeds) and
    ``c`` (problems), multinomial counts over n, E[w_i w_j] = ((n - 1) / n + [i == j]) / n^2,
    and Var = sum E[w_s w_t] E[c_p c_q] Z[s, p] Z[t, q] - mean(Z)^2 for Z = method - baseline."""
    z = np.asarray(method) - np.asarray(baseline)

    def second_moment(n: int) -> np.ndarray:
        return ((n - 1) / n * np.ones((n, n)) + np.eye(n)) / n**2

    ew, ec = second_moment(z.shape[0]), second_moment(z.shape[1])
    return float(np.einsum("st,pq,sp,tq->", ew, ec, z, z) - z.mean() ** 2)


# ------------------------------------------------------------------------------ statistics
def test_paired_difference_against_the_exact_bootstrap() -> None:
    result = paired_difference(METHOD, BASELINE, seeds_paired=True, replicates=200_000, seed=1)
    # by hand: the method's six values sum to 4, the baseline's to 2.5
    assert result.difference == pytest.approx(4.0 / 6 - 2.5 / 6)
    mean, sd = _exact_bootstrap(METHOD, BASELINE, paired=True)
    assert mean == pytest.approx(result.difference)
    assert sd == pytest.approx(math.sqrt(_ideal_variance(METHOD, BASELINE)), rel=1e-9)
    assert result.se == pytest.approx(sd, rel=0.01)
    assert result.mdd == pytest.approx(2.8015852 * result.se, rel=1e-6)
    assert result.seeds_paired and result.seed_test.kind == "paired t"
    assert result.low <= result.difference <= result.high


def test_unpaired_seeds_are_drawn_apart() -> None:
    baseline = [[0.5, 0.5, 0.0], [1.0, 0.5, 0.0], [0.0, 0.5, 0.5]]
    result = paired_difference(METHOD, baseline, seeds_paired=False, replicates=200_000,
                               seed=2)
    with pytest.raises(ValueError, match="as many rows"):
        paired_difference(METHOD, baseline, seeds_paired=True)
    method, base = np.asarray(METHOD), np.asarray(baseline)
    values = []
    for ps in itertools.product(range(3), repeat=3):
        for sm in itertools.product(range(2), repeat=2):
            for sb in itertools.product(range(3), repeat=3):
                values.append(method[np.ix_(sm, ps)].mean() - base[np.ix_(sb, ps)].mean())
    assert result.difference == pytest.approx(float(np.mean(values)))
    assert result.se == pytest.approx(float(np.std(values)), rel=0.01)
    assert result.seed_test.kind == "Welch t" and not result.seeds_paired


def test_seed_level_paired_t_by_hand() -> None:
    # differences 0.1, 0.2, 0.2: mean 1/6, sd 0.05774, se 0.03333, t = 5.0 with 2 df;
    # the t(2) cdf is 1/2 + t / (2 sqrt(t^2 + 2)), so p = 1 - 5 / sqrt(27)
    test = seed_test([0.6, 0.7, 0.8], [0.5, 0.5, 0.6], paired=True)
    assert (test.kind, test.df, test.n) == ("paired t", 2.0, 3)
    assert test.difference == pytest.approx(1 / 6)
    assert test.t == pytest.approx(5.0)
    assert test.p == pytest.approx(1 - 5 / math.sqrt(27))
    flat = seed_test([0.6, 0.7], [0.5, 0.6], paired=True)  # the same difference twice
    assert (flat.t, flat.p) == (None, 0.0)
    from gear_rl.stats import Difference
    from gear_rl.study.report import _seed_test

    shown = _seed_test(Difference(0.1, 0.0, 0.2, 0.05, 0.14, True, flat, "within noise", 0.95,
                                  0.8))
    assert shown == "paired t: undefined, every seed differs by +0.100 (no seed-to-seed variance)"
    assert seed_test([0.6], [0.5], paired=True) is None
    welch = seed_test([0.6, 0.7, 0.8], [0.5, 0.6], paired=False)
    assert welch.kind == "Welch t" and welch.n == 2


def test_minimum_detectable_difference() -> None:
    # (z(0.975) + z(0.8)) = 1.959964 + 0.841621
    assert minimum_detectable(0.01) == pytest.approx(0.02801585, rel=1e-6)
    assert minimum_detectable(0.01, confidence=0.9, power=0.5) == pytest.approx(0.01644854,
                                                                                rel=1e-6)
    with pytest.raises(ValueError, match="se"):
        minimum_detectable(-1.0)


@pytest.mark.parametrize(("low", "high", "words"), [
    (0.01, 0.05, "better beyond noise"), (-0.05, -0.01, "worse beyond noise"),
    (-0.01, 0.02, "within noise"), (0.0, 0.1, "within noise"), (-0.1, 0.0, "within noise"),
    (0.0, 0.0, "within noise")])
def test_verdict_wording(low: float, high: float, words: str) -> None:
    assert verdict(low, high) == words


def test_verdicts_of_clear_tables() -> None:
    better = paired_difference([[1, 1, 1, 0.75]] * 3, [[0.25, 0, 0.5, 0.25]] * 3,
                               seeds_paired=True, replicates=2000)
    assert better.verdict == "better beyond noise" and better.low > 0
    worse = paired_difference([[0.25, 0, 0.5, 0.25]] * 3, [[1, 1, 1, 0.75]] * 3,
                              seeds_paired=True, replicates=2000)
    assert worse.verdict == "worse beyond noise" and worse.high < 0
    same = paired_difference([[0.5, 1.0]] * 2, [[0.5, 1.0]] * 2, seeds_paired=True,
                             replicates=2000)
    assert (same.verdict, same.difference, same.se, same.mdd) == ("within noise", 0, 0, 0)
    with pytest.raises(ValueError, match="not an interval"):
        verdict(0.2, 0.1)


def test_bootstrap_mean_is_reproducible() -> None:
    first = bootstrap_mean(METHOD, replicates=5000, seed=3)
    assert first == bootstrap_mean(METHOD, replicates=5000, seed=3)
    assert first.value == pytest.approx(4 / 6) and first.low < first.value < first.high
    with pytest.raises(ValueError, match="not finite"):
        bootstrap_mean([[0.5, float("nan")]])


# ------------------------------------------------------------------------------ the spec
TINY_BUDGET = {
    "model": "tiny-random", "task": "arithmetic", "train_size": 32, "steps": 2,
    "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 8},
    "eval": {"size": 4, "k": 2, "max_new_tokens": 4},
    "log": {"report_to": "none", "samples_per_step": 2, "checkpoint_every": 1},
    "optim.lr": 1e-3,
}


def _spec(**changes) -> dict:
    data = {"name": "t", "seeds": [0, 1], "budget": dict(TINY_BUDGET),
            "tasks": {"arith": {}}, "methods": {"grpo": {}, "gear": {"seeds": [0, 1, 2]}}}
    data.update(changes)
    return data


def test_spec_builds_every_cell() -> None:
    spec = parse_spec(_spec(methods={
        "grpo": {}, "gear_paper": {"estimator": "gear", "label": "GEAR (paper)",
                                    "overrides": {"credit": {"lambda_kl": 0.2}},
                                    "seeds": [0, 1, 2]}}))
    assert spec.baseline == "grpo" and spec.metric == "mean@k"
    assert [c.name for c in spec.cells()] == [
        "arith/grpo-s0", "arith/gear_paper-s0", "arith/grpo-s1", "arith/gear_paper-s1",
        "arith/gear_paper-s2"]
    cell = spec.cells()[1]
    config = spec.cell_config(cell, "/tmp/x")
    assert (config.estimator, config.seed, config.credit) == ("gear", 0, {"lambda_kl": 0.2})
    assert config.eval.records and config.task == "arithmetic"
    assert config.out == "/tmp/x/cells/arith/gear_paper-s0"
    assert spec.method("gear_paper").label == "GEAR (paper)"


@pytest.mark.parametrize(("changes", "message"), [
    ({"method": {}}, r"unknown key 'method'; did you mean 'methods'"),
    ({"methods": {"grpo": {}, "gera": {}}}, r"method 'gera'.*unknown estimator 'gera'; did "
                                            r"you mean 'gear'"),
    ({"methods": {"grpo": {"overrides": {"credit.lambda_kl": 0.2}}}},
     r"method 'grpo'.*credit\.lambda_kl"),
    ({"methods": {"grpo": {"overides": {}}}}, r"methods\.grpo\.'overides'; did you mean "
                                              r"'overrides'"),
    ({"budget": {**TINY_BUDGET, "rollout.temprature": 0.5}}, r"rollout\.temprature"),
    ({"budget": {**TINY_BUDGET, "seed": 3}}, r"'seed' cannot be set in a study"),
    ({"budget": {**TINY_BUDGET, "threads": 2}}, r"threads=N"),
    ({"methods": {"grpo": {}, "gear": {"overrides": {"steps": 5}}}},
     r"methods\.gear\.overrides: 'steps' changes a setting every cell of a task must share"),
    ({"methods": {"grpo": {}, "gear": {"overrides": {"eval": {"k": 8}}}}},
     r"'eval\.k' changes a setting"),
    ({"baseline": "rlsd"}, r"baseline 'rlsd' is not one of the methods"),
    ({"seeds": [0, 0]}, r"lists a seed twice"),
    ({"seeds": []}, r"non-empty list of integers"),
    ({"metric": "accuracy"}, r"metric must be one of"),
    ({"tasks": {}}, r"tasks is missing or empty"),
    ({"statistics": {"confidence": 1.5}}, r"statistics\.confidence must be in"),
])
def test_spec_errors_name_the_key(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(_spec(**changes))


def test_project_study_files_are_valid() -> None:
    from gear_rl.study import load_spec

    folder = Path(__file__).resolve().parents[1] / "studies"
    names = sorted(p.name for p in folder.glob("*.yaml"))
    assert names == ["credit_control.yaml", "default.yaml", "grpo_weak.yaml", "sokoban.yaml",
                     "tool_math.yaml", "verl_gear_vs_grpo.yaml"]
    for path in folder.glob("*.yaml"):
        # a verl study here: its CPU budget (its GPU one names data a lab writes first)
        spec = load_spec(path, budget="cpu" if path.stem.startswith("verl_") else None)
        assert spec.baseline == "grpo"
        assert "estimated wall time" in path.read_text().lower()
        assert spec.engine == ("verl" if path.stem.startswith("verl_") else "gear-rl")


# ------------------------------------------------------------------------------ hand-made cells
def _write_cell(out: Path, task: str, method: str, estimator: str, seed: int,
                rewards: list[list[float]], *, steps: int = 2, k: int = 2,
                temperature: float = 0.6, credit: dict | None = None,
                earlier: dict[int, list[list[float]]] | None = None,
                samples_per_prompt: int = 4) -> Path:
    """A finished cell directory with known eval records at its final step (and at the
    ``earlier`` steps, same problems), whose config.yaml is what a cell of a study with
    :data:`TINY_BUDGET` trains under (with the settings given)."""
    run = out / "cells" / task / f"{method}-s{seed}"
    (run / "eval_records").mkdir(parents=True)
    settings = {**flatten_keys(TINY_BUDGET), "estimator": estimator, "seed": seed,
                "steps": steps, "eval.k": k, "eval.temperature": temperature,
                "rollout.samples_per_prompt": samples_per_prompt, "eval.records": True,
                "out": str(run), **{f"credit.{key}": v for key, v in (credit or {}).items()}}
    config = load_config(None, [f"{key}={json.dumps(v)}" for key, v in settings.items()])
    RunDir(run).write_config(config_to_dict(config))
    mean = float(np.mean([x >= 1 for r in rewards for x in r]))
    metrics = [{"step": s, "reward_mean": 0.1 * s, "entropy_mean": 1.0 - 0.1 * s}
               for s in range(1, steps + 1)]
    metrics[-1][f"eval/mean@{k}"] = mean
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run / "samples.jsonl").write_text("")
    for step, step_rewards in {**(earlier or {}), steps: rewards}.items():
        step_records = [{"id": f"p{i}", "answer": "1", "rewards": r}
                        for i, r in enumerate(step_rewards)]
        (run / "eval_records" / f"step-{step:06d}.json").write_text(json.dumps(
            {"step": step, "k": k, "seed": 1234, "records": step_records}))
    (run / "summary.json").write_text("{}")
    return run


def test_analysis_of_known_cells(tmp_path: Path) -> None:
    """Per-problem rewards chosen so every number is known: grpo solves 1 of 4 samples per
    problem, gear 2 of 4 on seed 0 and 3 of 4 on seed 1 (2 samples per problem, 2 problems)."""
    spec = parse_spec(_spec(methods={"grpo": {}, "gear": {}}, budget=TINY_BUDGET))
    for seed in (0, 1):
        _write_cell(tmp_path, "arith", "grpo", "grpo", seed, [[1, 0], [0, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [1, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 1, [[1, 1], [1, 0]])
    result = write_study(analyze_study(spec, tmp_path))
    task = result.tasks[0]
    grpo, gear = task.methods
    assert [c.score for c in grpo.cells] == [0.25, 0.25]
    assert [c.score for c in gear.cells] == [0.5, 0.75]
    assert gear.versus.difference == pytest.approx(0.625 - 0.25)
    assert gear.versus.seeds_paired
    saved = json.loads((tmp_path / "study.json").read_text())
    methods = saved["tasks"][0]["methods"]
    assert [m["key"] for m in methods] == ["grpo", "gear"]
    assert methods[1]["per_seed"] == [0.5, 0.75]
    assert methods[1]["versus"]["verdict"] == gear.versus.verdict
    assert methods[1]["cells"] == ["cells/arith/gear-s0", "cells/arith/gear-s1"]
    text = (tmp_path / "study.md").read_text()
    assert f"**{gear.versus.verdict}**" in text and "| gear | 0,1 | 0.625 |" in text
    assert "detectable (MDD)" in text and "**Bottom line** (against grpo)" in text
    assert (tmp_path / "plots" / "arith-curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "Cells trained on: processor not recorded, precision not recorded." in text


def test_contrasts_compare_pairs_beside_the_baseline(tmp_path: Path) -> None:
    """A ``contrasts`` pair is the same paired comparison as against the baseline, with the
    named method in the baseline's place: gear (0.625) against gear_mp (0.25) is gear_mp's
    difference from grpo with the roles swapped."""
    methods = {"grpo": {}, "gear": {}, "gear_mp": {"estimator": "gear"}}
    spec = parse_spec(_spec(methods=methods, contrasts=[["gear", "gear_mp"]]))
    for seed in (0, 1):
        _write_cell(tmp_path, "arith", "grpo", "grpo", seed, [[1, 0], [0, 0]])
        _write_cell(tmp_path, "arith", "gear_mp", "gear", seed, [[1, 0], [0, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [1, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 1, [[1, 1], [1, 0]])
    result = write_study(analyze_study(spec, tmp_path))
    (key, against, diff), = result.tasks[0].contrasts
    gear = result.tasks[0].methods[1]
    assert (key, against) == ("gear", "gear_mp")
    assert diff is not None and diff.difference == pytest.approx(0.625 - 0.25)
    assert (diff.low, diff.high, diff.verdict) == (gear.versus.low, gear.versus.high,
                                                   gear.versus.verdict)
    assert "| gear | gear_mp | +0.375 |" in (tmp_path / "study.md").read_text()
    saved = json.loads((tmp_path / "study.json").read_text())["tasks"][0]["contrasts"]
    assert saved[0]["key"] == "gear" and saved[0]["versus"]["difference"] == pytest.approx(0.375)
    for bad in ([["gear"]], [["gear", "gear"]], [["gear", "rlsd"]], "gear"):
        with pytest.raises(ValueError, match="contrasts"):
            parse_spec(_spec(methods=methods, contrasts=bad))


def test_earlier_evaluations_are_compared_too(tmp_path: Path) -> None:
    """A method that reaches the baseline's final score later shows the gap at the earlier
    evaluation: step 1, grpo solves 2 of 4 samples on seed 0 and 3 of 4 on seed 1, gear none;
    at the final step both solve all."""
    spec = parse_spec(_spec(methods={"grpo": {}, "gear": {}}, budget=TINY_BUDGET))
    full = [[1, 1], [1, 1]]
    _write_cell(tmp_path, "arith", "grpo", "grpo", 0, full, earlier={1: [[1, 0], [1, 0]]})
    _write_cell(tmp_path, "arith", "grpo", "grpo", 1, full, earlier={1: [[1, 1], [1, 0]]})
    for seed in (0, 1):
        _write_cell(tmp_path, "arith", "gear", "gear", seed, full, earlier={1: [[0, 0], [0, 0]]})
    result = write_study(analyze_study(spec, tmp_path))
    task = result.tasks[0]
    assert list(task.by_step) == [1]
    grpo, gear = task.by_step[1]
    assert grpo.estimate.value == pytest.approx(0.625) and grpo.versus is None
    assert gear.estimate.value == 0.0
    assert gear.versus.difference == pytest.approx(-0.625)
    assert task.methods[1].versus.difference == 0.0  # the final step's comparison unchanged
    text = (tmp_path / "study.md").read_text()
    assert "| method | step 1 | step 2 |" in text
    assert f"| gear | 0.000 ({gear.versus.difference:+.3f} [" in text
    saved = json.loads((tmp_path / "study.json").read_text())
    step_one = saved["tasks"][0]["by_step"]["1"]
    assert [m["key"] for m in step_one] == ["grpo", "gear"]
    assert step_one[1]["versus"]["difference"] == pytest.approx(-0.625)


def test_cells_that_end_below_their_start_are_named(tmp_path: Path) -> None:
    """A collapsed seed (final score below its own step-0 score) is listed, with both scores;
    a cell that ends level with its start is not."""
    spec = parse_spec(_spec(methods={"grpo": {}, "gear": {}}, budget=TINY_BUDGET))
    start = [[1, 0], [1, 0]]  # 0.5 before training, every cell
    _write_cell(tmp_path, "arith", "grpo", "grpo", 0, [[1, 1], [1, 0]], earlier={0: start})
    _write_cell(tmp_path, "arith", "grpo", "grpo", 1, start, earlier={0: start})
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [0, 0]], earlier={0: start})
    _write_cell(tmp_path, "arith", "gear", "gear", 1, [[1, 1], [1, 1]], earlier={0: start})
    write_study(analyze_study(spec, tmp_path))
    text = (tmp_path / "study.md").read_text()
    assert ("Cells that ended below their own step-0 score: gear seed 0 (0.500 -> 0.250)."
            in text)
    methods = json.loads((tmp_path / "study.json").read_text())["tasks"][0]["methods"]
    assert [m["ended_below_start"] for m in methods] == [[], [0]]
    assert methods[1]["per_seed_start"] == [0.5, 0.5]
    _write_cell(tmp_path / "level", "arith", "grpo", "grpo", 0, start, earlier={0: start})
    write_study(analyze_study(spec, tmp_path / "level"))
    assert ("Cells that ended below their own step-0 score: none."
            in (tmp_path / "level" / "study.md").read_text())


def test_the_report_names_where_each_cell_trained(tmp_path: Path) -> None:
    """A study that spans machines (seed 0 on a Xeon in bf16, seed 1 on an EPYC in fp32)
    says which cells ran where; the cells' run.json is what records it."""
    spec = parse_spec(_spec(methods={"grpo": {}, "gear": {}}, budget=TINY_BUDGET))
    for seed, info in ((0, {"cpu": "Intel Xeon", "autocast_bf16": True}),
                       (1, {"cpu": "AMD EPYC", "autocast_bf16": False})):
        for method in ("grpo", "gear"):
            run = _write_cell(tmp_path, "arith", method, method, seed, [[1, 0], [0, 0]])
            (run / "run.json").write_text(json.dumps(info))
    result = write_study(analyze_study(spec, tmp_path))
    assert cell_machines(result) == {
        "Intel Xeon, bf16 autocast": ["arith/grpo-s0", "arith/gear-s0"],
        "AMD EPYC, fp32": ["arith/grpo-s1", "arith/gear-s1"]}
    text = (tmp_path / "study.md").read_text()
    assert ("more than one machine or precision (compare methods within a seed, whose cells "
            "ran alike where the study ran them side by side): Intel Xeon, bf16 autocast (2: "
            "arith/grpo-s0, arith/gear-s0); AMD EPYC, fp32 (2: arith/grpo-s1, "
            "arith/gear-s1). Each seed's cells trained on one of them.") in text
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["cell_machines"]["AMD EPYC, fp32"] == ["arith/grpo-s1", "arith/gear-s1"]
    assert saved["mixed_seeds"] == {}


def test_machine_labels_name_processor_precision_and_a_sampler_set_apart() -> None:
    assert machine_label({"cpu": "X", "autocast_bf16": True,
                          "sampler_dtype": "torch.bfloat16"}) == "X, bf16 autocast"
    assert machine_label({"cpu": "X", "autocast_bf16": False,
                          "sampler_dtype": "torch.float32"}) == "X, fp32"
    assert machine_label({"cpu": "X", "autocast_bf16": False,
                          "sampler_dtype": "torch.bfloat16"}) == "X, fp32, sampler bf16"
    assert machine_label({"cpu": "X", "autocast_bf16": True,
                          "sampler_dtype": "torch.float32"}) == "X, bf16 autocast, sampler fp32"
    assert machine_label({}) == "processor not recorded, precision not recorded"


def test_a_seed_whose_cells_trained_apart_is_named(tmp_path: Path) -> None:
    """Methods are paired within a seed: a seed whose cells trained on different machines or
    precisions (seed 0: grpo on a Xeon in bf16, gear on an EPYC in fp32), or whose cell was
    resumed elsewhere part-way (seed 1's gear), is named in the report."""
    spec = parse_spec(_spec(methods={"grpo": {}, "gear": {}}, budget=TINY_BUDGET))
    xeon, epyc = {"cpu": "Intel Xeon", "autocast_bf16": True}, {"cpu": "AMD EPYC",
                                                                  "autocast_bf16": False}
    for method, seed, info in (("grpo", 0, xeon), ("gear", 0, epyc), ("grpo", 1, epyc),
                               ("gear", 1, {**epyc, "resumes": [{"step": 1, **xeon}]})):
        run = _write_cell(tmp_path, "arith", method, method, seed, [[1, 0], [0, 0]])
        (run / "run.json").write_text(json.dumps(info))
    result = write_study(analyze_study(spec, tmp_path))
    assert cell_machines(result) == {
        "Intel Xeon, bf16 autocast": ["arith/grpo-s0"],
        "AMD EPYC, fp32": ["arith/grpo-s1", "arith/gear-s0"],
        "AMD EPYC, fp32, then Intel Xeon, bf16 autocast": ["arith/gear-s1"]}
    assert mixed_seeds(result) == {
        "arith seed 0": {"Intel Xeon, bf16 autocast": ["arith/grpo-s0"],
                         "AMD EPYC, fp32": ["arith/gear-s0"]},
        "arith seed 1": {"AMD EPYC, fp32": ["arith/grpo-s1", "arith/gear-s1"],
                         "Intel Xeon, bf16 autocast": ["arith/gear-s1"]}}
    text = (tmp_path / "study.md").read_text()
    assert ("**Seeds whose cells trained on more than one** (their paired differences mix "
            "machines): arith seed 0 (Intel Xeon, bf16 autocast: arith/grpo-s0; AMD EPYC, "
            "fp32: arith/gear-s0); arith seed 1 (AMD EPYC, fp32: arith/grpo-s1, "
            "arith/gear-s1; Intel Xeon, bf16 autocast: arith/gear-s1).") in text
    assert json.loads((tmp_path / "study.json").read_text())["mixed_seeds"] == json.loads(
        json.dumps(mixed_seeds(result)))


def test_training_a_seed_on_another_machine_than_its_cells_warns(tmp_path: Path) -> None:
    """Before anything trains, a seed whose finished or interrupted cells ran elsewhere than
    the cells about to train here is named on stderr; a seed trained alike is not."""
    spec = parse_spec(_spec(methods={"grpo": {}, "gear": {}}))
    planned = {p.cell.name: p for p in plan_cells(spec, tmp_path)}
    here = {"cpu": cpu_model(), "autocast_bf16": resolves_to_bf16(
        planned["arith/grpo-s0"].config.precision, torch.device("cpu"))}
    for name, info in (("arith/grpo-s0", {"cpu": "Another CPU", "autocast_bf16": True}),
                       ("arith/grpo-s1", here)):
        item = planned[name]
        item.run_dir.mkdir(parents=True)
        RunDir(item.run_dir).write_config(config_to_dict(item.config))
        (item.run_dir / "summary.json").write_text("{}")
        (item.run_dir / "run.json").write_text(json.dumps(info))
    planned_now = plan_cells(spec, tmp_path)
    todo = [p for p in planned_now if p.state == "new"]
    (line,) = mixed_seed_warnings(planned_now, todo)
    assert line.startswith("gear-rl study: warning: arith seed 0: its cells would train on "
                           "more than one machine or precision (Another CPU, bf16 autocast: "
                           f"grpo-s0; {machine_label(here)} (here): gear-s0).")
    assert "retrain the others here, or train these where the others ran" in line
    assert mixed_seed_warnings(planned_now, [p for p in todo if p.cell.seed == 1]) == []


def test_cells_whose_settings_differ_are_refused(tmp_path: Path) -> None:
    spec = parse_spec(_spec(methods={"grpo": {"seeds": [0]}, "gear": {"seeds": [0]}}))
    _write_cell(tmp_path, "arith", "grpo", "grpo", 0, [[1, 0], [0, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [1, 0]], temperature=1.0)
    # judged only under what the study file gives it: the odd cell is named before the cells
    # are compared with each other
    with pytest.raises(ValueError, match=r"cell arith/gear-s0: .*another config \(differs in "
                                         r"\['eval\.temperature'\]\)"):
        analyze_study(spec, tmp_path)


def test_an_equal_token_arm_sets_its_own_samples_per_prompt(tmp_path: Path) -> None:
    """A method's ``samples_per_prompt`` (per task) is the one shared setting it may change:
    its cells train with it, the report accepts it and names it, and any other difference in
    samples per prompt is still refused."""
    methods = {"grpo": {"seeds": [0]}, "gear": {"seeds": [0]},
               "grpo_tokens": {"estimator": "grpo", "seeds": [0], "label": "grpo, equal tokens",
                               "samples_per_prompt": {"arith": 12}}}
    spec = parse_spec(_spec(methods=methods))
    configs = {c.method.key: spec.cell_config(c, tmp_path) for c in spec.cells()}
    assert configs["grpo_tokens"].rollout.samples_per_prompt == 12
    assert configs["grpo"].rollout.samples_per_prompt == 4
    _write_cell(tmp_path, "arith", "grpo", "grpo", 0, [[1, 0], [0, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [1, 0]])
    _write_cell(tmp_path, "arith", "grpo_tokens", "grpo", 0, [[1, 1], [0, 0]],
                samples_per_prompt=12)
    result = write_study(analyze_study(spec, tmp_path))
    assert [m.method.key for m in result.tasks[0].methods] == ["grpo", "gear", "grpo_tokens"]
    assert result.tasks[0].contrasts == []
    assert ("grpo, equal tokens: `rollout.samples_per_prompt=12`"
            in (tmp_path / "study.md").read_text())
    shutil.rmtree(tmp_path / "cells" / "arith" / "grpo_tokens-s0")
    _write_cell(tmp_path, "arith", "grpo_tokens", "grpo", 0, [[1, 1], [0, 0]],
                samples_per_prompt=8)  # not what the spec says
    with pytest.raises(ValueError, match=r"rollout\.samples_per_prompt"):
        analyze_study(spec, tmp_path)
    shutil.rmtree(tmp_path / "cells" / "arith" / "grpo_tokens-s0")
    _write_cell(tmp_path, "arith", "grpo_tokens", "grpo", 0, [[1, 1], [0, 0]],
                samples_per_prompt=12)
    analyze_study(spec, tmp_path)  # as the spec says again
    shutil.rmtree(tmp_path / "cells" / "arith" / "gear-s0")
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [1, 0]], samples_per_prompt=6)
    with pytest.raises(ValueError, match=r"rollout\.samples_per_prompt"):
        analyze_study(spec, tmp_path)
    for bad, message in [({"other": 12}, r"must give every task's value"),
                         ({"arith": 0}, r"samples_per_prompt\.arith must be an integer >= 1"),
                         ({"arith": True}, r"must be an integer")]:
        with pytest.raises(ValueError, match=message):
            parse_spec(_spec(methods={"grpo": {}, "g": {"estimator": "grpo",
                                                          "samples_per_prompt": bad}}))


def test_cells_evaluated_on_other_problems_are_refused(tmp_path: Path) -> None:
    spec = parse_spec(_spec(methods={"grpo": {"seeds": [0]}, "gear": {"seeds": [0]}}))
    _write_cell(tmp_path, "arith", "grpo", "grpo", 0, [[1, 0], [0, 0]])
    _write_cell(tmp_path, "arith", "gear", "gear", 0, [[1, 0], [1, 0], [0, 0]])
    with pytest.raises(ValueError, match="different held-out problems"):
        analyze_study(spec, tmp_path)


def test_plan_sees_what_each_cell_folder_holds(tmp_path: Path) -> None:
    spec = parse_spec(_spec(methods={"grpo": {"seeds": [0, 1, 2]}, "gear": {"seeds": [0]}}))
    planned = {p.cell.name: p for p in plan_cells(spec, tmp_path)}
    assert {p.state for p in planned.values()} == {"new"}

    def saved(name: str, **changes) -> Path:
        item = planned[name]
        run = RunDir(item.run_dir)
        item.run_dir.mkdir(parents=True)
        run.write_config({**config_to_dict(item.config), **changes})
        return item.run_dir

    saved("arith/grpo-s0")
    (tmp_path / "cells/arith/grpo-s0/summary.json").write_text("{}")
    interrupted = saved("arith/grpo-s1", threads=7)  # threads may change on resume
    folder = interrupted / "checkpoints" / "step-000001"
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"x")
    (interrupted / "checkpoints" / "latest").write_text("step-000001\n")
    saved("arith/grpo-s2")
    states = {p.cell.name: p.state for p in plan_cells(spec, tmp_path)}
    assert states == {"arith/grpo-s0": "finished", "arith/grpo-s1": "interrupted",
                      "arith/grpo-s2": "no_checkpoint", "arith/gear-s0": "new"}
    saved("arith/gear-s0", steps=99)
    with pytest.raises(ValueError, match=r"cell arith/gear-s0: .*another config \(differs in "
                                         r"\['steps'\]\).*the study file changed"):
        plan_cells(spec, tmp_path)



def test_a_cell_saved_before_an_option_existed_is_still_the_same_cell(tmp_path: Path) -> None:
    """A finished cell whose saved config lacks an option added later (its default then) plans
    as finished, as a resume reads it; a key this version does not know is a difference."""
    spec = parse_spec(_spec(methods={"grpo": {"seeds": [0]}}))
    (item,) = plan_cells(spec, tmp_path)
    run = RunDir(item.run_dir)
    item.run_dir.mkdir(parents=True)
    (item.run_dir / "summary.json").write_text("{}")
    older = config_to_dict(item.config)
    del older["agent"]["reuse_kv_cache"]
    run.write_config(older)
    assert plan_cells(spec, tmp_path)[0].state == "finished"
    run.write_config({**config_to_dict(item.config), "retired_option": 1})
    with pytest.raises(ValueError, match=r"differs in \['retired_option'\]"):
        plan_cells(spec, tmp_path)

def test_default_parallelism() -> None:
    assert default_parallelism(cores=2, memory_gb=24) == (2, 1)
    assert default_parallelism(cores=16, memory_gb=24) == (4, 4)
    assert default_parallelism(cores=1, memory_gb=2) == (1, 1)
    # threads default to the cores shared among the jobs, also when jobs= is given
    assert resolve_parallelism(None, None, cores=2, memory_gb=24) == (2, 1)
    assert resolve_parallelism(1, None, cores=2, memory_gb=24) == (1, 2)
    assert resolve_parallelism(2, None, cores=16, memory_gb=24) == (2, 8)
    assert resolve_parallelism(1, 3, cores=2, memory_gb=24) == (1, 3)
    assert resolve_parallelism(None, 2, cores=16, memory_gb=24) == (4, 2)


def test_cli_arguments(tmp_path: Path, capsys) -> None:
    assert main(["study"]) == 2
    assert "usage: gear-rl study" in capsys.readouterr().out
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_spec()))
    assert main(["study", str(path), "job=2"]) == 2
    assert "unknown argument 'job'; did you mean 'jobs'" in capsys.readouterr().err
    assert main(["study", str(path), "jobs=0"]) == 2
    assert "positive integer" in capsys.readouterr().err
    assert main(["study", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    # nothing trained: the report says so for each task
    assert main(["study", str(path), f"out={tmp_path / 'o'}", "train=false"]) == 0
    assert "No cell of this task has finished yet" in (tmp_path / "o" / "study.md").read_text()


def test_a_part_of_a_study_is_selected_by_method_seed_and_task(tmp_path: Path, capsys) -> None:
    spec = parse_spec(_spec())  # grpo seeds 0, 1; gear seeds 0, 1, 2

    def names(cells: list) -> list[str]:
        return [cell.name for cell in cells]

    assert names(select_cells(spec)) == names(spec.cells())
    assert names(select_cells(spec, ["gear"])) == ["arith/gear-s0", "arith/gear-s1",
                                                   "arith/gear-s2"]
    assert names(select_cells(spec, seeds=[1])) == ["arith/grpo-s1", "arith/gear-s1"]
    assert names(select_cells(spec, ["grpo", "gear"], [1, 2])) == [
        "arith/grpo-s1", "arith/gear-s1", "arith/gear-s2"]
    with pytest.raises(ValueError, match=r"methods=rlsd: not a method of 't' \(its methods: "
                                         r"grpo, gear\)"):
        select_cells(spec, ["rlsd"])
    with pytest.raises(ValueError, match=r"seeds=7: no method of 't' has it \(its seeds: "
                                         r"0, 1, 2\)"):
        select_cells(spec, seeds=[7])
    with pytest.raises(ValueError, match="selects no cell"):
        select_cells(spec, ["grpo"], [2])
    two = parse_spec(_spec(tasks={"arith": {}, "other": {"overrides": {"task": "arithmetic"}}}))
    assert names(select_cells(two, tasks=["other"])) == [
        "other/grpo-s0", "other/gear-s0", "other/grpo-s1", "other/gear-s1", "other/gear-s2"]
    assert names(select_cells(two, ["grpo"], [0], ["arith"])) == ["arith/grpo-s0"]
    with pytest.raises(ValueError, match=r"tasks=sokoban: not a task of 't' \(its tasks: "
                                         r"arith, other\)"):
        select_cells(two, tasks=["sokoban"])
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_spec()))
    for argument, message in (("methods=grpo,", "comma-separated list"),
                              ("seeds=a", "comma-separated integers"),
                              ("methods=rlsd", "not a method of 't'"),
                              ("tasks=other", "not a task of 't'")):
        assert main(["study", str(path), f"out={tmp_path / 'o'}", argument]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o" / "cells").exists()  # refused before anything trained


@pytest.mark.slow
def test_only_the_selected_cells_train(tmp_path: Path) -> None:
    from gear_rl.study import run_study

    spec = parse_spec(_spec(seeds=[0], methods={"grpo": {}, "gear": {}}))
    seen = []
    result = run_study(spec, tmp_path, jobs=1, threads=1, progress=False, on_cell=seen.append,
                       methods=["gear"])
    assert [o.cell.name for o in seen] == ["arith/gear-s0"] and not result.failed
    assert {p.cell.name: p.state for p in plan_cells(spec, tmp_path)} == {
        "arith/grpo-s0": "new", "arith/gear-s0": "finished"}
    from gear_rl.rundir import cpu_model

    info = RunDir(tmp_path / "cells/arith/gear-s0").read_info()
    assert info["cpu"] == cpu_model() and isinstance(info["autocast_bf16"], bool)


@pytest.mark.slow
def test_a_finished_cell_keeps_its_final_policy_and_not_its_checkpoints(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from gear_rl.study import run_study
    from gear_rl.train.checkpoint import read_checkpoint
    from gear_rl.train.export import EXPORT_INFO

    spec = parse_spec(_spec(seeds=[0], methods={"grpo": {}}, keep_checkpoints="policy"))
    result = run_study(spec, tmp_path, jobs=1, threads=1, progress=False)
    assert not result.failed
    run = RunDir(tmp_path / "cells/arith/grpo-s0")
    assert run.finished() and not run.checkpoints.exists()
    policy = run.path / "policy"
    info = json.loads((policy / EXPORT_INFO).read_text())
    assert (info["step"], info["dtype"]) == (2, "bfloat16")
    exported = AutoModelForCausalLM.from_pretrained(policy)
    assert next(exported.parameters()).dtype == torch.bfloat16
    # the weights are the final checkpoint's, rounded to bf16 (checked against a second run of
    # the same cell that keeps its checkpoints: training is deterministic on the CPU)
    kept = parse_spec(_spec(seeds=[0], methods={"grpo": {}}, keep_checkpoints=True))
    assert not run_study(kept, tmp_path / "kept", jobs=1, threads=1, progress=False).failed
    reference = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    read_checkpoint(tmp_path / "kept/cells/arith/grpo-s0", reference)
    for (name, mine), theirs in zip(exported.state_dict().items(),
                                    reference.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs.to(torch.bfloat16)), name


def test_keep_checkpoints_takes_true_false_or_policy() -> None:
    assert parse_spec(_spec(keep_checkpoints="policy")).keep_checkpoints == "policy"
    with pytest.raises(ValueError, match="keep_checkpoints must be true, false or 'policy'"):
        parse_spec(_spec(keep_checkpoints="weights"))


# ------------------------------------------------------------------------------ paired evaluation
def test_evaluation_draws_are_fixed_per_problem_and_sample() -> None:
    """Problem 0's samples do not change when problem 1's responses end at other steps: each
    (problem, sample) row keeps its place in the random stream. Many "stop" tokens make rows end
    at different steps, which would shift the later draws of a stream shared by active rows."""
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model
    from gear_rl.sampling import SamplingParams
    from gear_rl.tasks import Problem, Task
    from gear_rl.train.evaluate import evaluate

    tokenizer = build_tiny_tokenizer()
    model = tiny_random_model("llama", seed=1, initializer_range=0.2)

    def problem(i: int, text: str) -> Problem:
        return Problem(id=f"p{i}", prompt=[{"role": "user", "content": text}], answer="x",
                       reference="x")

    pair = [problem(0, "count to 1"), problem(1, "count to 2")]
    task = Task(name="t", train=pair, eval=pair, scorer=lambda p, t: float(len(t) % 2),
                extract=lambda t: t)
    sampling = SamplingParams(max_new_tokens=12, stop_ids=range(0, 259, 4), pad_id=0)
    runs = [evaluate(model, tokenizer, task, problems=[problem(0, "count to 1"),
                                                        problem(1, second)],
                     sampling=sampling, k=8, seed=5)
            for second in ("count to 2", "count to 7")]
    first, other = runs[0]["records"], runs[1]["records"]
    assert first[1]["lengths"] != other[1]["lengths"]  # problem 1's rows end elsewhere ...
    assert first[0] == other[0]  # ... and problem 0's samples are the same
    assert len(set(first[0]["lengths"])) > 1  # its own rows end at different steps too


def test_trainer_writes_eval_records(tmp_path: Path) -> None:
    from conftest import tiny_trainer
    from gear_rl.rundir import read_eval_records
    from gear_rl.study.report import problem_scores

    trainer = tiny_trainer(tmp_path / "run", "eval.records=true", "eval.every=1",
                           "eval.at_start=true", "eval.k=3")
    trainer.train()
    evaluations = read_eval_records(tmp_path / "run")
    assert sorted(evaluations) == [0, 1, 2]
    metrics = {r["step"]: r for r in RunDir(tmp_path / "run").read_metrics() if "eval/mean@3"
               in r}
    for step, data in evaluations.items():
        assert data["k"] == 3 and len(data["records"]) == 2
        assert all(len(r["rewards"]) == 3 for r in data["records"])
        assert np.mean(problem_scores(data["records"], "mean@k")) == pytest.approx(
            metrics[step]["eval/mean@3"])


# ------------------------------------------------------------------------------ a real study
KILL_SPEC = {
    "name": "kill", "baseline": "grpo",
    "budget": {**TINY_BUDGET, "steps": 6,
               "eval": {"size": 4, "k": 2, "max_new_tokens": 4, "every": 3}},
    "tasks": {"arith": {}},
    "methods": {"grpo": {"seeds": [0, 1]}, "gear": {"seeds": [0],
                                                    "overrides": {"loss.opsd_coef": 0.5}}},
}


def _study_command(spec: Path, out: Path, jobs: int) -> list[str]:
    return [sys.executable, "-m", "gear_rl.cli", "study", str(spec), f"out={out}",
            f"jobs={jobs}", "threads=1", "progress=false"]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _stamps(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and p.name != ".lock"}


def _comparable(out: Path) -> dict:
    data = json.loads((out / "study.json").read_text())
    data.pop("timing")
    registration = data.pop("registration")  # only the time it was recorded may differ
    registration.pop("registered")
    data["registered_fields"] = registration
    return data


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_measurement(k)}
            for r in RunDir(run).read_metrics()]


@pytest.mark.slow
def test_a_killed_study_continues_where_it_stopped(tmp_path: Path) -> None:
    spec = tmp_path / "kill.yaml"
    spec.write_text(yaml.safe_dump(KILL_SPEC, sort_keys=False))  # the cells in this order
    full = tmp_path / "full"
    done = subprocess.run(_study_command(spec, full, jobs=2), env=_env(), timeout=1200,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    broken = tmp_path / "broken"
    first, second = broken / "cells/arith/grpo-s0", broken / "cells/arith/gear-s0"
    process = subprocess.Popen(_study_command(spec, broken, jobs=1), env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # kill it once the first cell finished and the second has a checkpoint
    kill_when(process, lambda: RunDir(first).finished() and RunDir(second).latest_checkpoint()
              is not None and not RunDir(second).finished(), timeout=1200, poll=0.05,
              what="the study")
    assert not RunDir(second).finished()
    # the running cell died with the study (no orphan keeps training into its folder)
    deadline = time.time() + 60
    while True:
        try:
            RunDir(second).lock()
            RunDir(second).unlock()
            break
        except ValueError:
            assert time.time() < deadline, "the cell process outlived its study"
            time.sleep(0.2)
    before = _stamps(first)
    again = subprocess.run(_study_command(spec, broken, jobs=1), env=_env(), timeout=1200,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _stamps(first) == before  # the finished cell was not rerun
    assert "resume=" in (broken / "cells/arith/gear-s0.log").read_text()
    for name in ("grpo-s0", "grpo-s1", "gear-s0"):
        assert _metrics(broken / "cells/arith" / name) == _metrics(full / "cells/arith" / name)
        assert not (broken / "cells/arith" / name / "checkpoints").exists()
    assert _comparable(broken) == _comparable(full)
    timings = json.loads((broken / "timings.json").read_text())
    assert all(entry["finished"] for entry in timings.values()) and len(timings) == 3


@pytest.mark.slow
def test_a_cell_interrupted_before_its_first_checkpoint_starts_again(tmp_path: Path) -> None:
    from gear_rl.study import run_study

    spec = parse_spec(_spec(seeds=[0], methods={"grpo": {}}))
    (item,) = plan_cells(spec, tmp_path)
    run = RunDir(item.run_dir)
    item.run_dir.mkdir(parents=True)
    run.write_config(config_to_dict(item.config))
    (item.run_dir / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    assert plan_cells(spec, tmp_path)[0].state == "no_checkpoint"
    seen = []
    result = run_study(spec, tmp_path, jobs=1, threads=1, progress=False, on_cell=seen.append)
    assert [o.cell.name for o in seen] == ["arith/grpo-s0"] and not result.failed
    assert run.finished() and [r["step"] for r in run.read_metrics()] == [0, 1, 2]
    assert plan_cells(spec, tmp_path)[0].state == "finished"


@pytest.mark.slow
def test_sigterm_stops_the_study_and_its_running_cell_cleanly(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) reaches the study alone: it takes the Ctrl-C path (gear_rl.stop),
    passes the signal on to its running cell, which stops at once keeping its checkpoints, and
    says how to continue; before, the study died on the spot and its cell with it."""
    spec = tmp_path / "term.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "term", "baseline": "grpo", "budget": {**TINY_BUDGET, "steps": 200},
        "tasks": {"arith": {}}, "methods": {"grpo": {"seeds": [0]}}}, sort_keys=False))
    out = tmp_path / "out"
    cell = RunDir(out / "cells/arith/grpo-s0")
    process = subprocess.Popen(_study_command(spec, out, jobs=1), env=_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 600
        while cell.latest_checkpoint() is None:
            assert process.poll() is None and time.time() < deadline, "the cell never started"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, err[-2000:]
    assert "interrupted; rerun the same command" in err and "Traceback" not in err
    assert cell.latest_checkpoint() is not None and not cell.finished()
    cell.lock()  # the cell's process is gone: nothing trains on into its folder
    cell.unlock()
    assert "interrupted" in (out / "cells/arith/grpo-s0.log").read_text()
