"""One viewer for every engine (issue 41): the TRL adapter's run log (``CreditGRPOTrainer`` with
``log_samples_per_step``), read by ``gear-rl report`` and ``gear-rl compare`` like a ``gear-rl
train`` run, and the shared pieces of :mod:`gear_rl.runlog`. The verl side is
``tests/test_verl_cpu_job.py`` (a real CPU verl job writes the same records)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from conftest import tiny_trainer
from gear_rl.cli import main
from gear_rl.report import compare_runs, load_run
from gear_rl.rundir import RunDir
from gear_rl.runlog import EngineRunLog, engine_metrics, pick_rows

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_GENERATIONS = 4
QUESTIONS = [("2+3?", "5"), ("7*6?", "42")]


# ------------------------------------------------------------------ the shared pieces
def test_pick_rows_takes_best_and_worst_of_mixed_groups_first() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert pick_rows(rewards, groups, 5) == [2, 3, 5, 4, 0]
    assert pick_rows(rewards, groups, 0) == []
    assert pick_rows(rewards, groups, 99) == [2, 3, 5, 4, 0, 1, 6, 7]


def test_engine_metrics_keeps_finite_numbers_and_names_diagnostics_bare() -> None:
    import numpy as np

    values = engine_metrics({"gear/segment_frac": np.float64(0.25), "actor/loss": torch.tensor(2.0),
                             "text": "x", "flag": True, "nan": float("nan"), "many": [1, 2],
                             "gear/teacher_prompt_spliced_head_frac": 1.0})
    assert values == {"gear/segment_frac": 0.25, "segment_frac": 0.25, "actor/loss": 2.0,
                      "gear/teacher_prompt_spliced_head_frac": 1.0}
    assert "segment_frac" not in engine_metrics({"gear/segment_frac": 0.5}, prefix=None)


def test_verl_validation_reads_as_the_held_out_mean() -> None:
    from gear_rl.runlog import verl_held_out

    one = {"val-core/openai/gsm8k/acc/mean@4": 0.25, "val-aux/openai/gsm8k/acc/std@4": 0.1,
           "val-core/openai/gsm8k/acc/best@4/mean": 0.5, "critic/score/mean": 0.3}
    assert verl_held_out(one) == {"eval/mean@4": 0.25}
    assert verl_held_out({"val-core/a/reward/mean@2": 1.0}) == {"eval/mean@2": 1.0}
    two = {"val-core/a/acc/mean@4": 0.25, "val-core/b/acc/mean@4": 0.75}
    assert verl_held_out(two) == {} and verl_held_out({"critic/score/mean": 0.3}) == {}
    assert verl_held_out({"val-core/a/acc/mean@4": float("nan")}) == {}


def test_engine_run_log_starts_fresh_and_continues_after_a_checkpoint(tmp_path) -> None:
    path = tmp_path / "run"
    log = EngineRunLog(path, engine="verl", config={"estimator": "gear"}, info={"x": 1})
    for step in (1, 2, 3):
        log.log_step(step, {"reward_mean": step / 10}, [{"step": step, "tokens": ["a"]}])
    log.finish({"steps": 3})
    run = RunDir(path)
    assert run.read_info() == {"engine": "verl", "x": 1}
    assert run.read_config() == {"engine": "verl", "estimator": "gear"}
    assert run.read_summary()["engine"] == "verl"
    # resumed from step 2's checkpoint: step 3's records go, the rest stays
    again = EngineRunLog(path, engine="verl", config={"estimator": "other"}, info={},
                         first_step=3)
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    assert [r["step"] for r in run.read_samples()] == [1, 2]
    assert run.read_config()["estimator"] == "gear"
    with pytest.raises(ValueError, match="in use by another verl run"):
        EngineRunLog(path, engine="verl", config={}, info={})
    again.close()
    # a new run in the same folder starts over and drops the old summary
    EngineRunLog(path, engine="trl", config={}, info={}).close()
    assert run.read_metrics() == [] and not run.finished()
    with pytest.raises(ValueError, match="engine must be one of"):
        EngineRunLog(path, engine="jax", config={}, info={})


# ------------------------------------------------------------------ a real TRL run
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


def _reward(completions, **_):
    # deterministic and varied within a group, so advantages have both signs
    return [float(sum(map(ord, c[0]["content"])) % 3) for c in completions]


def _trl_trainer(out: Path, *, steps: int = 2, **config):
    from gear_rl.integrations.trl import CreditGRPOConfig, CreditGRPOTrainer
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model

    torch.manual_seed(0)
    rows = [{"prompt": [{"role": "user", "content": q}], "reference": ref}
            for q, ref in QUESTIONS]
    args = CreditGRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        per_device_train_batch_size=2 * NUM_GENERATIONS, num_generations=NUM_GENERATIONS,
        max_completion_length=6, max_steps=steps, logging_steps=1, learning_rate=1e-2, seed=0,
        beta=0.0, temperature=1.0, **config)
    # initializer_range 0.3: peaked predictions, so that what a token is scored with matters
    model = tiny_random_model("llama", seed=1, initializer_range=0.3)
    return CreditGRPOTrainer(model=model, reward_funcs=_reward,
                             args=args, train_dataset=datasets.Dataset.from_list(rows),
                             processing_class=build_tiny_tokenizer())


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory, one_thread) -> tuple[Path, list[torch.Tensor]]:
    """A real 2-step GEAR run of TRL on a tiny random model with the run log on (3 samples a
    step), and the ``[B, T]`` advantages TRL's loss received at each step."""
    out = tmp_path_factory.mktemp("trl") / "run"
    trainer = _trl_trainer(out, credit={"lambda_kl": 0.05}, log_samples_per_step=3)
    handed: list[torch.Tensor] = []
    compute_loss = trainer._compute_loss

    def record_loss(model, inputs):
        if not any(a is inputs["advantages"] for a in handed):
            handed.append(inputs["advantages"])
        return compute_loss(model, inputs)

    trainer._compute_loss = record_loss  # type: ignore[method-assign]
    trainer.train()
    assert trainer.run_log is None  # closed at the end
    return out, [a.detach().clone() for a in handed]


def test_trl_run_log_holds_the_credit_the_loss_used(trl_run) -> None:
    out, handed = trl_run
    run = load_run(out)
    assert run.engine == "trl" and run.estimator == "gear" and run.seed == 0
    # mean_preserving, whose default changed after runs were first recorded, is written out
    assert run.config["credit"] == {"lambda_kl": 0.05, "mean_preserving": True}
    assert run.config["steps"] == 2
    assert run.config["rollout"]["samples_per_prompt"] == NUM_GENERATIONS
    assert run.config["trl"]["num_generations"] == NUM_GENERATIONS
    # the unnamed dataset by its content hash (the same rows: the same name)
    rows = [{"prompt": [{"role": "user", "content": q}], "reference": ref}
            for q, ref in QUESTIONS]
    assert run.config["task"] == f"dataset {datasets.Dataset.from_list(rows)._fingerprint}"
    assert run.summary["engine"] == "trl" and run.summary["steps"] == 2
    assert [s["step"] for s in run.samples] == [1, 1, 1, 2, 2, 2]
    for sample in run.samples:
        n = len(sample["tokens"])
        assert n == len(sample["token_ids"]) > 0 and sample["answer"] in ("5", "42")
        for key in ("mask", "entropy", "divergence", "student_logprobs", "teacher_logprobs",
                    "token_advantage", "weight", "segment_onset"):
            assert isinstance(sample[key], list) and len(sample[key]) == n, key
        # the logged token credit is what TRL's loss received for that row (the rows are
        # shuffled inside TRL's buffer: find it among the step's rows)
        rows = handed[sample["step"] - 1]
        match = [r for r in rows[:, :n] if torch.allclose(
            r, torch.tensor(sample["token_advantage"]), atol=1e-4)]
        assert match, (sample["step"], sample["token_advantage"])
    assert any(abs(a) > 0 for s in run.samples for a in s["token_advantage"])
    # one line per step from the batch (trainer names), one per logging step from TRL
    by_step = [r for r in run.metrics if "reward_mean" in r]
    assert [r["step"] for r in by_step] == [1, 2]
    for record in by_step:
        assert {"reward_std", "groups_mixed", "response_len", "entropy_mean", "adv_abs_mean",
                "divergence_mean", "segment_frac"} <= set(record)
    assert {"trl/loss", "trl/reward", "trl/gear/adv_abs_mean"} <= {
        key for r in run.metrics for key in r}
    # the signal pass saw each response with its prompt: its entropy is the one TRL's own
    # forward measured (TRL trains with gradient checkpointing on by default, which drops the
    # shared prompts' KV cache: tests/test_signals.py, ..._drops_the_prompt_cache_...)
    assert run.config["trl"]["gradient_checkpointing"] is True
    trl_entropy = {r["step"]: r["trl/entropy"] for r in run.metrics if "trl/entropy" in r}
    for record in by_step:
        assert record["entropy_mean"] == pytest.approx(trl_entropy[record["step"]], rel=1e-3)


def test_gear_rl_report_shows_a_trl_runs_token_credit(trl_run, tmp_path) -> None:
    out, _ = trl_run
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert '<code id="engine">trl</code>' in page
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)'
                                r"</script>", page, re.S).group(1))
    assert [s["key"] for s in data["signals"] if s["available"]] == [
        "divergence", "normalized", "entropy", "segment", "weight", "advantage"]
    shown = [t for entry in data["steps"] for pair in entry["pairs"]
             for t in (pair["pos"], pair["neg"]) if t is not None]
    samples = load_run(out).samples
    assert shown and all(t["signals"]["advantage"] in [s["token_advantage"] for s in samples]
                         for t in shown)
    for name in ("reward", "entropy", "segments", "weights", "step_time"):
        assert (tmp_path / "rep" / f"{name}.png").is_file(), name


def test_gear_rl_compare_of_a_trl_run_and_a_gear_rl_run(trl_run, tmp_path) -> None:
    out, _ = trl_run
    ours = tmp_path / "ours"
    tiny_trainer(ours, "estimator=grpo", "eval.size=2").train()
    with pytest.raises(ValueError, match=r"engine \('\(unset\)' vs 'trl'\)"):
        compare_runs([ours, out])
    comparison = compare_runs([ours, out], tmp_path / "cmp", allow_mismatch=True)
    assert [m.label for m in comparison.methods] == ["grpo"]
    assert [r.path for r in comparison.unfinished] == [out]
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "no held-out eval (trl run, 2 steps)" in text
    assert main(["compare", str(ours), str(out), "--allow-mismatch", "--out",
                 str(tmp_path / "cmp2")]) == 0


def test_trl_run_log_off_writes_nothing(tmp_path) -> None:
    out = tmp_path / "off"
    trainer = _trl_trainer(out, steps=1, estimator="grpo", log_samples_per_step=0)
    trainer.train()
    assert trainer.run_log is None
    assert not any((out / name).exists() for name in (
        "config.yaml", "run.json", "metrics.jsonl", "samples.jsonl", "summary.json"))


def test_trl_run_log_of_grpo_has_no_signals_and_a_chosen_folder(tmp_path) -> None:
    out, logs = tmp_path / "out", tmp_path / "logs"
    _trl_trainer(out, steps=1, estimator="grpo", run_log_dir=str(logs)).train()
    assert not (out / "samples.jsonl").exists()
    run = load_run(logs)
    assert len(run.samples) == 4 and run.engine == "trl"
    for sample in run.samples:
        assert sample["divergence"] is None and sample["segment_onset"] is None
        assert sample["weight"] is not None  # GRPO's W is 1 on policy tokens of A != 0
    assert yaml.safe_load((logs / "config.yaml").read_text())["estimator"] == "grpo"


def test_config_refuses_bad_run_log_settings(tmp_path) -> None:
    from gear_rl.integrations.trl import CreditGRPOConfig

    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="log_samples_per_step"):
            CreditGRPOConfig(output_dir=str(tmp_path), use_cpu=True, log_samples_per_step=bad)
    with pytest.raises(ValueError, match="run_log_dir"):
        CreditGRPOConfig(output_dir=str(tmp_path), use_cpu=True, run_log_dir="")
