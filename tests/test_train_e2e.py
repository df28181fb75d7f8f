"""Tiny-model end-to-end runs of every estimator: two steps each, finite loss, parameters that
move, metrics and samples written."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_trainer
from gear_rl.credit import estimator_names
from gear_rl.train import Trainer
from gear_rl.train.records import is_measurement

REQUIRED = ("step", "reward_mean", "entropy_mean", "loss", "time/step", "time/rollout",
            "grad_norm", "clip_frac", "approx_kl", "memory/rss_gb", "memory/peak_rss_gb")


def make_trainer(tmp_path, *overrides: str) -> Trainer:
    return tiny_trainer(tmp_path / "run", *overrides)


def run_and_check(tmp_path, *overrides: str) -> list[dict]:
    trainer = make_trainer(tmp_path, *overrides)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    summary = trainer.train()
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True)), \
        "no parameter changed"
    run_dir = trainer.run_dir
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        for key in REQUIRED:
            assert key in record, key
            assert math.isfinite(record[key]), (key, record[key])
    assert "eval/mean@1" in steps[-1]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    for sample in samples:
        assert len(sample["tokens"]) == len(sample["entropy"]) == len(sample["mask"])
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert (run_dir / "config.yaml").is_file()
    assert summary["steps"] == 2
    for record in steps:  # the peak is the process's so far: never below what is resident
        assert 0 < record["memory/rss_gb"] <= record["memory/peak_rss_gb"]
    assert summary["peak_rss_gb"] == max(r["memory/peak_rss_gb"] for r in steps)
    return steps


@pytest.mark.parametrize("estimator", estimator_names(step_level=False))
def test_every_estimator_trains_two_steps(tmp_path, estimator: str) -> None:
    steps = run_and_check(tmp_path, f"estimator={estimator}")
    if estimator.startswith("gear"):
        assert "segment_frac" in steps[0] and "divergence_mean" in steps[0]
        assert "weight_mean_pos" in steps[0] or "weight_mean_neg" in steps[0]
    if estimator == "opsd":
        assert steps[0]["opsd_loss"] > 0 and steps[0]["pg_loss"] == 0


def test_gear_samples_carry_token_signals(tmp_path) -> None:
    trainer = make_trainer(tmp_path, "estimator=gear", "steps=1")
    trainer.train()
    sample = json.loads((trainer.run_dir / "samples.jsonl").read_text().splitlines()[0])
    n = len(sample["tokens"])
    for key in ("divergence", "entropy", "weight", "segment_onset", "token_advantage",
                "teacher_logprobs"):
        assert len(sample[key]) == n, key
    teacher = trainer.tokenizer.decode(trainer._prompts(trainer.task.train[0])[1])
    # the library's default hint, the same one TRL and verl use
    assert "The correct final answer is: an even number of letters" in teacher


def test_kl_opsd_agg_modes_epochs_minibatches(tmp_path) -> None:
    steps = run_and_check(tmp_path, "estimator=grpo", "loss.kl_coef=0.1", "loss.opsd_coef=0.5",
                          "loss.agg_mode=seq-mean-token-sum-norm", "loss.epochs=2",
                          "loss.minibatches=2", "optim.warmup_steps=2",
                          "log.report_to=tensorboard")
    assert steps[0]["lr"] == pytest.approx(0.5e-3) and steps[1]["lr"] == pytest.approx(1e-3)
    assert "ref_kl" in steps[0] and steps[0]["opsd_loss"] > 0
    assert any((tmp_path / "run" / "tensorboard").iterdir())


def test_same_seed_same_metrics(tmp_path) -> None:
    def strip(records):
        return [{k: v for k, v in r.items() if not is_measurement(k)}
                for r in records]

    a = run_and_check(tmp_path / "a", "estimator=gear")
    b = run_and_check(tmp_path / "b", "estimator=gear")
    assert strip(a) == strip(b)


def test_refuses_to_overwrite_a_run(tmp_path) -> None:
    make_trainer(tmp_path, "steps=1").train()
    with pytest.raises(ValueError, match="already holds a run"):
        make_trainer(tmp_path, "steps=1")
