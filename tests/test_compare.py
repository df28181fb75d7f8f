"""``gear-rl compare``: the seed-level statistics against published t-table values, the table's
verdicts on hand-written run directories with known finals, and one real end-to-end comparison
that trains a tiny model with two estimators over two seeds."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml
from PIL import Image

from gear_rl.cli import main
from gear_rl.report.compare import compare_runs
from gear_rl.stats import t_interval, welch_test
from gear_rl.train.config import config_to_dict, load_config

pytestmark = pytest.mark.usefixtures("one_thread")


def write_run(path: Path, estimator: str, seed: int, final: float, *, k: int = 4,
              steps: int = 3, credit: dict | None = None, task: str = "products") -> Path:
    """A finished run directory in the trainer's format with a known final Mean@k (``credit``
    recorded as the trainer records it: ``config_to_dict``)."""
    path.mkdir(parents=True)
    recorded = config_to_dict(load_config(None, [f"estimator={estimator}"] + [
        f"credit.{key}={value}" for key, value in (credit or {}).items()]))["credit"]
    (path / "config.yaml").write_text(yaml.safe_dump({
        "model": "tiny-random", "task": task, "estimator": estimator, "credit": recorded,
        "steps": steps, "seed": seed, "eval": {"k": k}}))
    records = [{"step": 0, f"eval/mean@{k}": 0.3, f"eval/pass@{k}": 0.6}]
    records += [{"step": s, "reward_mean": final * s / steps, "time/step": 1.0}
                for s in range(1, steps + 1)]
    records[-1].update({f"eval/mean@{k}": final, f"eval/pass@{k}": min(1.0, final + 0.2)})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "samples.jsonl").write_text("")
    (path / "summary.json").write_text(json.dumps({"final": {f"eval/mean@{k}": final}}))
    return path


# ------------------------------------------------------------------------------ statistics
@pytest.mark.parametrize(("df", "confidence", "critical"), [
    (1, 0.95, 12.706205), (2, 0.95, 4.302653), (4, 0.95, 2.776445), (9, 0.95, 2.262157),
    (30, 0.95, 2.042272), (4, 0.90, 2.131847), (4, 0.99, 4.604095), (9, 0.99, 3.249836)])
def test_t_interval_uses_the_t_table(df: int, confidence: float, critical: float) -> None:
    # 0, 1, ..., df: n = df + 1 values, so the interval's half width in units of the standard
    # error is the two-sided critical value of t(df).
    values = [float(i) for i in range(df + 1)]
    mean, low, high = t_interval(values, confidence)
    standard_error = statistics.stdev(values) / math.sqrt(len(values))
    assert mean == pytest.approx(df / 2)
    assert (high - mean) / standard_error == pytest.approx(critical, rel=1e-6)
    assert (mean - low) / standard_error == pytest.approx(critical, rel=1e-6)


def test_t_interval() -> None:
    mean, low, high = t_interval([0.5, 0.6, 0.7])
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert mean == pytest.approx(0.6)
    assert (low, high) == pytest.approx((0.6 - half, 0.6 + half), rel=1e-5)
    assert t_interval([0.4]) == (0.4, None, None)
    assert t_interval([0.2, 0.2, 0.2, 0.2]) == (0.2, 0.2, 0.2)  # no spread: a point
    with pytest.raises(ValueError, match="empty"):
        t_interval([])
    with pytest.raises(ValueError, match="confidence"):
        t_interval([0.1, 0.2], 1.0)


def test_welch_test() -> None:
    # Equal sizes and variances: Welch's df is 2n - 2, here 4; |t| = 3.674 lies between the
    # two-sided 5% (2.776) and 2% (3.747) critical values of t(4).
    result = welch_test([0.0, 1.0, 2.0], [3.0, 4.0, 5.0])
    assert result.difference == -3.0
    assert result.df == pytest.approx(4.0)
    assert result.t == pytest.approx(-3.0 / math.sqrt(2 / 3))
    assert 0.02 < result.p < 0.05
    assert result.p == pytest.approx(0.02131164112875683, rel=1e-6)
    assert welch_test([1.0], [1.0, 2.0]) is None
    assert welch_test([1.0, 2.0], [1.0]) is None


def test_welch_p_values_in_closed_form() -> None:
    # n = 2 and 2 with equal variances: df = 2, where P(|T| > t) = 1 - t / sqrt(2 + t^2).
    result = welch_test([0.0, 2.0], [3.0, 5.0])
    assert result.df == pytest.approx(2.0)
    assert result.t == pytest.approx(-3.0 / math.sqrt(2.0))
    t = abs(result.t)
    assert result.p == pytest.approx(1.0 - t / math.sqrt(2.0 + t * t), rel=1e-9)
    # One side without spread: df = n - 1 of the other side, here 1, the Cauchy distribution,
    # where P(|T| > t) = 1 - 2 atan(t) / pi.
    result = welch_test([0.0, 2.0], [5.0, 5.0])
    assert (result.t, result.df) == pytest.approx((-4.0, 1.0))
    assert result.p == pytest.approx(1.0 - 2.0 * math.atan(4.0) / math.pi, rel=1e-9)


def test_welch_fractional_df() -> None:
    # Unequal sizes and variances give a non-integer Welch-Satterthwaite df; the numbers are
    # scipy.stats.ttest_ind(a, b, equal_var=False)'s.
    result = welch_test([0.1, 0.9], [0.3, 0.35, 0.4, 0.45])
    assert result.difference == pytest.approx(0.125)
    assert result.t == pytest.approx(0.3114876876541916, rel=1e-9)
    assert result.df == pytest.approx(1.013048905988538, rel=1e-9)
    assert result.p == pytest.approx(0.8072488886245646, rel=1e-6)


def test_welch_without_spread() -> None:
    flat = welch_test([0.5, 0.5], [0.5, 0.5])
    assert (flat.difference, flat.t, flat.df, flat.p) == (0.0, None, None, 1.0)
    apart = welch_test([0.5, 0.5], [0.7, 0.7])
    assert apart.t is None and apart.p == 0.0
    # Three equal 0.72s have a floating-point variance of ~1e-32, not 0: still no spread, not
    # a difference established by a t of ~1e15.
    rounded = welch_test([0.7, 0.7, 0.7], [0.72, 0.72, 0.72])
    assert (rounded.t, rounded.df, rounded.p) == (None, None, 0.0)
    same = welch_test([0.1, 0.1, 0.1], [0.1, 0.1, 0.1])
    assert (same.t, same.p) == (None, 1.0)


# ------------------------------------------------------------------------------ table
def test_compare_table_says_what_is_noise(tmp_path: Path) -> None:
    runs = []
    for seed, (g, a, b) in enumerate([(0.50, 0.70, 0.49), (0.52, 0.72, 0.53),
                                      (0.48, 0.68, 0.51)]):
        runs.append(write_run(tmp_path / f"grpo-s{seed}", "grpo", seed, g))
        runs.append(write_run(tmp_path / f"gear-s{seed}", "gear", seed, a))
        runs.append(write_run(tmp_path / f"gear2-s{seed}", "gear", seed, b,
                              credit={"lambda_kl": 0.2}))
    out = tmp_path / "cmp"
    comparison = compare_runs(runs[::-1], out)  # order of the arguments must not matter
    assert comparison.metric == "eval/mean@4"
    assert [m.label for m in comparison.methods] == ["grpo", "gear[lambda_kl=0.2]", "gear"]
    grpo, tuned, gear = comparison.methods
    assert grpo.mean == pytest.approx(0.5) and [r.seed for r in grpo.runs] == [0, 1, 2]
    half = 4.302653 * 0.02 / math.sqrt(3)
    assert (grpo.low, grpo.high) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-5)
    assert "better than grpo" in gear.verdict and gear.versus.p < 0.001
    assert "within noise" in tuned.verdict and tuned.versus.p > 0.5
    text = comparison.markdown.read_text()
    assert "| gear | 0,1,2 | 0.700 |" in text
    assert "Welch's two-sided t-test" in text and "p < 0.05" in text
    assert "within noise of grpo: gear[lambda_kl=0.2]" in text
    assert "not logged" in text  # says the interval is seed-level only
    assert "more than one machine" not in text  # none of these records where it ran
    saved = json.loads((out / "compare.json").read_text())
    assert saved["methods"][2]["finals"] == pytest.approx([0.70, 0.72, 0.68])
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out / "curves.png") as image:
        axes = json.loads(image.text["Axes"])
    assert [(a["xlabel"], a["ylabel"]) for a in axes] == [
        ("training step", "held-out mean@4"), ("training step", "mean reward")]


def test_one_seed_has_no_interval_and_no_verdict(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / "a", "grpo", 0, 0.5), write_run(tmp_path / "b", "gear", 0, 0.9)]
    comparison = compare_runs(runs, tmp_path / "out")
    assert comparison.methods[1].low is None
    assert "not established" in comparison.methods[1].verdict
    text = comparison.markdown.read_text()
    assert "no CI (1 seed)" in text and "no method differs from grpo beyond noise" in text


def test_runs_trained_on_more_than_one_machine_or_precision_are_named(tmp_path: Path) -> None:
    """precision: auto resolves per machine, so a comparison whose runs trained apart (or one
    resumed elsewhere) says where each ran; runs that trained alike say nothing."""
    xeon, epyc = {"cpu": "Intel Xeon", "autocast_bf16": True}, {"cpu": "AMD EPYC",
                                                                  "autocast_bf16": False}
    runs = []
    for name, estimator, seed, info in (("grpo-s0", "grpo", 0, xeon), ("grpo-s1", "grpo", 1, epyc),
                                        ("gear-s0", "gear", 0, xeon),
                                        ("gear-s1", "gear", 1,
                                         {**xeon, "resumes": [{"step": 2, **epyc}]})):
        runs.append(write_run(tmp_path / name, estimator, seed, 0.5 + 0.1 * seed))
        (runs[-1] / "run.json").write_text(json.dumps(info))
    text = compare_runs(runs, tmp_path / "out").markdown.read_text()
    assert ("**Trained on more than one machine or precision** (`precision: auto` is bf16 where "
            "it is native and fp32 elsewhere, and the same weights sample differently under the "
            "two): Intel Xeon, bf16 autocast (grpo-s0, gear-s0); AMD EPYC, fp32 (grpo-s1); Intel "
            "Xeon, bf16 autocast, then AMD EPYC, fp32 (gear-s1).") in text
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert saved["trained_on"]["AMD EPYC, fp32"] == ["grpo-s1"]
    for run in runs:
        (run / "run.json").write_text(json.dumps(epyc))
    alike = compare_runs(runs, tmp_path / "alike")
    assert "more than one machine" not in alike.markdown.read_text()


def test_unlike_runs_are_refused_unless_allowed(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / "a", "grpo", 0, 0.5),
            write_run(tmp_path / "b", "gear", 0, 0.5, steps=5, task="other")]
    with pytest.raises(ValueError, match=r"differs from .* in task .*steps"):
        compare_runs(runs, None)
    comparison = compare_runs(runs, None, allow_mismatch=True)
    assert comparison.markdown is None
    assert list(comparison.mismatch) == ["task", "steps"]
    assert "differ in task, steps" in " ".join(comparison.notes)


def test_bad_comparisons_are_refused(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", "grpo", 0, 0.5)
    with pytest.raises(ValueError, match="both grpo with seed 0"):
        compare_runs([a, write_run(tmp_path / "a2", "grpo", 0, 0.6)])
    k2 = write_run(tmp_path / "k2", "gear", 0, 0.6, k=2)
    with pytest.raises(ValueError, match=r"in eval\.k \(4 vs 2\)"):
        compare_runs([a, k2])
    with pytest.raises(ValueError, match=r"same eval\.k"):
        compare_runs([a, k2], allow_mismatch=True)
    no_eval = write_run(tmp_path / "ne", "gear", 1, 0.6)
    (no_eval / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.1}\n')
    with pytest.raises(ValueError, match="no held-out eval"):
        compare_runs([a, no_eval])
    with pytest.raises(ValueError, match="baseline 'rlsd'"):
        compare_runs([a], baseline="rlsd")
    with pytest.raises(ValueError, match="at least one"):
        compare_runs([])


def test_compare_cli_reads_run_directories(tmp_path: Path, capsys) -> None:
    runs = [str(write_run(tmp_path / f"s{s}", "grpo", s, 0.5 + s / 100)) for s in range(2)]
    assert main(["compare", *runs, "--out", str(tmp_path / "o")]) == 0
    assert "| grpo | 0,1 | 0.505 |" in capsys.readouterr().out
    assert main(["compare", "steps=3"]) == 2
    assert "give run directories" in capsys.readouterr().err
    assert main(["compare", "--estimators", "grpo", "model=tiny-random"]) == 2
    assert "--out is required" in capsys.readouterr().err
    assert main(["compare", "--estimators", "grpo", "--out", str(tmp_path / "x"),
                 "seed=3"]) == 2
    assert "set per run by compare" in capsys.readouterr().err


def test_compare_trains_estimators_over_seeds(tmp_path: Path, capsys) -> None:
    """The real thing: a tiny random model, two estimators x two seeds, one step each."""
    out = tmp_path / "cmp"
    argv = ["compare", "--estimators", "grpo,gear", "--seeds", "0,1", "--out", str(out),
            "model=tiny-random", "steps=1", "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2", "rollout.max_new_tokens=6", "eval.size=4",
            "eval.k=2", "eval.max_new_tokens=4", "log.report_to=none",
            "log.progress=false", "log.checkpoint_every=0", "threads=1"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| grpo | 0,1 |" in table and "| gear | 0,1 |" in table
    for name in ("grpo-s0", "grpo-s1", "gear-s0", "gear-s1"):
        config = yaml.safe_load((out / name / "config.yaml").read_text())
        assert (config["estimator"], config["seed"]) == (name[:4], int(name[-1]))
        assert (out / name / "summary.json").is_file()
    saved = json.loads((out / "compare.json").read_text())
    assert saved["baseline"] == "grpo" and saved["metric"] == "eval/mean@2"
    # Finished runs are reused, not retrained ...
    stamp = (out / "gear-s1" / "metrics.jsonl").stat().st_mtime_ns
    assert main(argv) == 0
    assert (out / "gear-s1" / "metrics.jsonl").stat().st_mtime_ns == stamp
    # ... unless the config changed, which is refused rather than silently mixed.
    assert main([*argv[:-1], "threads=1", "steps=2"]) == 2
    assert "another config" in capsys.readouterr().err


def test_band_plot_gives_every_method_its_own_line() -> None:
    """More methods than the ten default colours (a study has eleven): colour and line style
    together still tell every method apart."""
    from gear_rl.figures import band_plot

    methods = [(f"m{i}", [[([0, 1], [0.1 * i, 0.2 * i])]]) for i in range(23)]
    plot = band_plot("curves", "t", [("reward", "mean reward")], methods)
    lines = plot.figure.axes[0].get_lines()
    assert len(lines) == 23
    assert len({(line.get_color(), line.get_linestyle()) for line in lines}) == 23
