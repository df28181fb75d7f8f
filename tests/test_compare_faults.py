"""``gear-rl compare`` on runs that must not be pooled or scored: runs with different tasks,
models, budgets or eval settings (refused unless explicitly allowed, then named in the tables),
crashed runs (listed as unfinished, never scored by their start-of-run eval), and an interrupted
``--estimators`` comparison (resumed from its checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gear_rl.cli import main
from gear_rl.report.compare import COMPARABLE, compare_runs
from gear_rl.train.config import config_to_dict, load_config

pytestmark = pytest.mark.usefixtures("one_thread")


def write_run(path: Path, *overrides: str, evals: dict[int, float], last_step: int | None = None,
              summary: bool = True) -> Path:
    """A run directory as the trainer writes it: the resolved config of ``overrides``, one
    metrics record per training step up to ``last_step`` (default: the configured steps) with
    the held-out eval of ``evals`` (step -> Mean@k) on its step, and ``summary.json`` when
    ``summary``."""
    config = config_to_dict(load_config(None, ["model=tiny-random", *overrides, f"out={path}"]))
    config["out"] = str(path)
    k, steps = config["eval"]["k"], config["steps"]
    last_step = steps if last_step is None else last_step
    records = [{"step": 0}] if 0 in evals else []
    records += [{"step": s, "reward_mean": 0.1 * s, "loss": 0.01, "time/step": 1.0}
                for s in range(1, last_step + 1)]
    for record in records:
        if record["step"] in evals:
            value = evals[record["step"]]
            record.update({f"eval/mean@{k}": value, f"eval/pass@{k}": min(1.0, value + 0.2)})
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "samples.jsonl").write_text("")
    if summary:
        ends = [(s, v) for s, v in sorted(evals.items())]
        (path / "summary.json").write_text(json.dumps({
            "run_dir": str(path), "estimator": config["estimator"], "steps": last_step,
            f"eval_start_mean@{k}": ends[0][1], f"eval_end_mean@{k}": ends[-1][1],
            "eval_history": [[s, v, min(1.0, v + 0.2)] for s, v in ends]}))
    return path


# ------------------------------------------------------------------------------ not like for like
def test_runs_of_another_task_and_budget_are_not_pooled(tmp_path: Path, capsys) -> None:
    # A 12-step products run and a 2-step run on a file task, both grpo: seeds 0 and 1 of one
    # method if nothing checked them.
    products = write_run(tmp_path / "products-s0", "estimator=grpo", "seed=0", "steps=12",
                         evals={0: 0.2, 12: 0.6})
    files = write_run(tmp_path / "file-s1", "estimator=grpo", "seed=1", "steps=2",
                      "task=data/problems.jsonl", evals={0: 0.1, 2: 0.1})
    with pytest.raises(ValueError) as refused:
        compare_runs([products, files], tmp_path / "cmp")
    message = str(refused.value)
    assert "\n" not in message
    assert str(products) in message and str(files) in message
    assert "task ('products' vs 'data/problems.jsonl')" in message
    assert "steps (12 vs 2)" in message and "--allow-mismatch" in message
    assert not (tmp_path / "cmp").exists()
    # The command line refuses them the same way, with the same one line.
    assert main(["compare", str(products), str(files), "--out", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert "not comparable" in err and "steps (12 vs 2)" in err
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize(("key", "override"), [
    ("task_options", "task_options.max_terms=3"), ("instruction", "instruction=Think."),
    ("eval_data", "eval_data=data/held.jsonl"), ("train_size", "train_size=50"),
    ("model", "model=smollm2-135m"), ("rollout.prompts_per_step", "rollout.prompts_per_step=3"),
    ("rollout.samples_per_prompt", "rollout.samples_per_prompt=2"),
    ("rollout.max_new_tokens", "rollout.max_new_tokens=16"), ("eval.size", "eval.size=8"),
    ("eval.k", "eval.k=2"), ("eval.temperature", "eval.temperature=1.0"),
    ("eval.top_p", "eval.top_p=0.9"), ("eval.max_new_tokens", "eval.max_new_tokens=16"),
    ("eval.seed", "eval.seed=7")])
def test_every_setting_that_changes_the_score_is_checked(tmp_path: Path, key: str,
                                                         override: str) -> None:
    assert key in COMPARABLE
    a = write_run(tmp_path / "a", "estimator=grpo", "steps=2", evals={2: 0.5})
    b = write_run(tmp_path / "b", "estimator=gear", "steps=2", override, evals={2: 0.5})
    with pytest.raises(ValueError, match=rf"{b} differs from {a} in {key} \("):
        compare_runs([a, b])


def test_what_a_comparison_varies_is_not_a_mismatch(tmp_path: Path) -> None:
    # Estimator, credit.*, seed, and settings that do not change the scores (threads, logging,
    # eval cadence, batch sizes) may differ.
    runs = [write_run(tmp_path / "a", "estimator=grpo", "steps=2", evals={2: 0.5}),
            write_run(tmp_path / "b", "estimator=gear", "steps=2", "seed=3",
                      "credit.lambda_kl=0.2", "threads=1", "log.report_to=none",
                      "eval.every=1", "eval.batch_size=4", "loss.micro_batch_size=2",
                      evals={1: 0.4, 2: 0.6})]
    comparison = compare_runs(runs)
    assert comparison.mismatch == {}
    assert [m.label for m in comparison.methods] == ["grpo", "gear[lambda_kl=0.2]"]


def test_an_allowed_mismatch_is_written_into_the_tables(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", "estimator=grpo", "steps=12", evals={12: 0.6})
    b = write_run(tmp_path / "b", "estimator=grpo", "seed=1", "steps=2", "eval.top_p=0.9",
                  evals={2: 0.2})
    out = tmp_path / "cmp"
    comparison = compare_runs([a, b], out, allow_mismatch=True)
    assert comparison.mismatch == {"steps": {str(a): 12, str(b): 2},
                                   "eval.top_p": {str(a): 0.95, str(b): 0.9}}
    text = (out / "compare.md").read_text()
    assert "**Not like for like:** the runs differ in steps, eval.top_p" in text
    assert "| run directory | steps | eval.top_p |" in text
    assert f"| `{a}` | 12 | 0.95 |" in text and f"| `{b}` | 2 | 0.9 |" in text
    saved = json.loads((out / "compare.json").read_text())
    assert saved["mismatch"] == {"steps": {str(a): 12, str(b): 2},
                                 "eval.top_p": {str(a): 0.95, str(b): 0.9}}
    assert any("differ in steps, eval.top_p" in note for note in saved["notes"])


# ------------------------------------------------------------------------------ unfinished runs
def test_a_crashed_run_is_listed_unfinished_not_scored(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / f"grpo-s{s}", "estimator=grpo", f"seed={s}", "steps=12",
                      evals={0: 0.2, 12: final}) for s, final in ((0, 0.5), (1, 0.6))]
    # Crashed after step 5 of 12: its only eval is the one at the start (a high 0.9).
    crashed = write_run(tmp_path / "grpo-s2", "estimator=grpo", "seed=2", "steps=12",
                        evals={0: 0.9}, last_step=5, summary=False)
    out = tmp_path / "cmp"
    comparison = compare_runs([*runs, crashed], out)
    (grpo,) = comparison.methods
    assert [r.seed for r in grpo.runs] == [0, 1] and grpo.finals == [0.5, 0.6]
    assert grpo.mean == pytest.approx(0.55)
    assert [(r.path, r.unfinished_at) for r in comparison.unfinished] == [(crashed, 5)]
    text = (out / "compare.md").read_text()
    assert "| grpo | 0,1 | 0.550 |" in text
    assert "0.500, 0.600, seed 2 unfinished at step 5 |" in text
    assert f"| grpo | 2 | 0.900 | unfinished at step 5 | 0 | 5 | `{crashed}` |" in text
    assert "3 runs, 1 of them unfinished" in text
    saved = json.loads((out / "compare.json").read_text())
    assert saved["methods"][0]["finals"] == [0.5, 0.6]
    assert saved["methods"][0]["unfinished"] == [str(crashed)]
    assert saved["unfinished"] == [{"label": "grpo", "seed": 2, "run": str(crashed),
                                    "unfinished_at": 5, "last_eval_step": 0}]
    assert any("no summary.json" in note for note in saved["notes"])


def test_a_run_whose_last_eval_is_before_its_last_step_is_unfinished(tmp_path: Path) -> None:
    # A finished 4-step run continued with resume=RUN steps=8 and killed at step 6: config.yaml
    # says 8 steps, the 4-step summary.json is still there, the last eval is the one at step 4.
    done = write_run(tmp_path / "a", "estimator=grpo", "steps=8", evals={8: 0.5})
    extended = write_run(tmp_path / "b", "estimator=gear", "steps=8", evals={4: 0.8},
                         last_step=6)
    comparison = compare_runs([done, extended], tmp_path / "cmp")
    assert [m.label for m in comparison.methods] == ["grpo"]
    assert [(r.path, r.unfinished_at) for r in comparison.unfinished] == [(extended, 6)]
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| gear | — | — | — | seed 0 unfinished at step 6 | no finished run |" in text
    assert "0.800" not in text.split("## Runs")[0]
    assert any("last held-out eval at step 4 of 8" in note for note in comparison.notes)


def test_methods_without_a_finished_run(tmp_path: Path) -> None:
    grpo = write_run(tmp_path / "grpo", "estimator=grpo", "steps=4", evals={0: 0.1, 4: 0.4})
    gear = write_run(tmp_path / "gear", "estimator=gear", "steps=4", evals={0: 0.7},
                     last_step=3, summary=False)
    with pytest.raises(ValueError, match="baseline 'gear' has no finished run"):
        compare_runs([grpo, gear], baseline="gear")
    with pytest.raises(ValueError, match=rf"no run finished: {gear} unfinished at step 3"):
        compare_runs([gear])
    # The default baseline grpo unfinished: the first method with a finished run instead.
    lone = write_run(tmp_path / "lone", "estimator=grpo", "seed=1", "steps=4", evals={0: 0.2},
                     last_step=2, summary=False)
    comparison = compare_runs([lone, write_run(tmp_path / "g2", "estimator=gear", "seed=1",
                                               "steps=4", evals={4: 0.3})])
    assert [m.label for m in comparison.methods] == ["gear"]
    assert "grpo has no finished run; the baseline is gear" in comparison.notes


# ------------------------------------------------------------------------------ resuming
class CrashError(RuntimeError):
    """Stands in for a kill in the middle of a training step."""


def test_an_interrupted_comparison_resumes_its_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    """The real thing: a tiny model's 2-step run dies during step 2, after the checkpoint of
    step 1; running the same comparison again resumes it from that checkpoint."""
    from gear_rl.train.trainer import Trainer

    out = tmp_path / "cmp"
    argv = ["compare", "--estimators", "grpo", "--seeds", "0", "--out", str(out),
            "model=tiny-random", "steps=2", "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2", "rollout.max_new_tokens=6", "eval.size=4",
            "eval.k=2", "eval.max_new_tokens=4", "eval.at_start=false", "log.report_to=none",
            "log.progress=false", "log.checkpoint_every=1", "threads=1"]
    step = Trainer.step

    def dies_in_step_2(self, number, *args, **kwargs):
        if number == 2:
            raise CrashError("killed in step 2")
        return step(self, number, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "step", dies_in_step_2)
        with pytest.raises(CrashError):
            main(argv)
    run = out / "grpo-s0"
    assert not (run / "summary.json").exists()
    assert (run / "checkpoints" / "step-000001" / "state.pt").is_file()
    step_1 = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in step_1] == [1]
    run_info = (run / "run.json").read_text()
    # Another config for the interrupted run is refused, before any training.
    assert main([*argv, "eval.top_p=0.9"]) == 2
    assert "holds an interrupted run with another config" in capsys.readouterr().err
    # The same comparison again: resumed, not refused ("already holds a run"), not restarted.
    assert main(argv) == 0
    assert "| grpo | 0 |" in capsys.readouterr().out
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert lines[0] == step_1[0]  # step 1 (its wall time included) is the interrupted run's
    assert "eval/mean@2" in json.loads(lines[1])
    resumed_info = json.loads((run / "run.json").read_text())  # the same run, resumed once
    assert [entry["step"] for entry in resumed_info.pop("resumes")] == [1]
    assert resumed_info == json.loads(run_info)
    assert (run / "summary.json").is_file()
    saved = json.loads((out / "compare.json").read_text())
    assert saved["methods"][0]["runs"] == [str(run)] and saved["unfinished"] == []


def test_a_run_interrupted_before_its_first_checkpoint_is_named(tmp_path: Path,
                                                                capsys) -> None:
    out = tmp_path / "cmp"
    overrides = ["model=tiny-random", "steps=2", "log.report_to=none"]
    run = out / "grpo-s0"
    write_run(run, *overrides, "estimator=grpo", "seed=0", evals={}, last_step=1,
              summary=False)
    argv = ["compare", "--estimators", "grpo", "--seeds", "0", "--out", str(out), *overrides]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run} holds a run interrupted before its first checkpoint" in err
