"""The trainer's values phase and the Monte-Carlo estimators (SPO-chain, VinePPO) end to end on
a tiny model: the values are the credit check's estimator's, the credit is the registry's on
them, and engines that cannot run a mid-step rollout refuse these estimators by name."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_trainer
from gear_rl.credit import get_estimator
from gear_rl.mc_values import Trajectory, estimate_values
from gear_rl.seeding import derive_seed
from gear_rl.train.episodes import task_reward_fn

FP32 = ("seed=0", "precision=fp32", "rollout.dtype=fp32", "rollout.max_new_tokens=12")


@pytest.mark.parametrize(("estimator", "fusion"), [("spo_chain", None), ("vineppo", "before")])
def test_values_phase_feeds_the_estimator(tmp_path, estimator: str, fusion) -> None:
    trainer = tiny_trainer(tmp_path / "run", f"estimator={estimator}", *FP32,
                           "credit.mc_samples=3", "credit.whiten=false")
    try:
        batch = trainer.rollout(1)
        assert trainer.engine.fusion(batch) == fusion
        scores = trainer.score(batch)  # the whole scoring pass, as the spine runs it unfused
        trainer.values(batch, scores, 1)
        extras = batch.extras
        assert extras is not None
        bounds = trainer.estimator.mc_boundaries(scores.credit_batch(batch), trainer.credit_config)
        assert any(bounds) and len(extras["mc_values"]) == len(batch.response_ids)
        # the credit check's estimator with the trainer's settings and seed: the same values
        rows = [row for row, b in enumerate(bounds) if b]
        again = estimate_values(
            trainer.sampler,
            [Trajectory(batch.prompt_ids[row], batch.response_ids[row], batch.finished[row],
                        bounds[row],
                        task_reward_fn(trainer.task, batch.problems[row], trainer.tokenizer))
             for row in rows],
            samples=3, max_new_tokens=12, stop_ids=trainer.stop_ids, pad_id=trainer.pad_id,
            temperature=trainer.config.rollout.temperature, top_p=trainer.config.rollout.top_p,
            seeds=(derive_seed(0, 3, 1),), batch_size=trainer.config.rollout.mc_batch_size,
            dedupe=True)
        for row, (b, values) in enumerate(zip(bounds, extras["mc_values"], strict=True)):
            assert len(values) == len(b)
            if b:
                assert values == again[rows.index(row)].values().tolist()
                assert all(0.0 <= v <= 1.0 for v in values)  # mean rewards of a 0/1 task
        assert batch.rollout_metrics is not None and batch.rollout_metrics["mc/tokens"] > 0
        got = trainer.credit(batch, scores, 1)
        want = get_estimator(estimator)(scores.credit_batch(batch), trainer.credit_config)
        torch.testing.assert_close(got, want.float())
        assert float(got.abs().sum()) > 0
    finally:
        trainer.close()


@pytest.mark.parametrize("estimator", ["spo_chain", "vineppo"])
def test_a_monte_carlo_run_trains_and_logs_its_phase(tmp_path, estimator: str) -> None:
    trainer = tiny_trainer(tmp_path / "run", f"estimator={estimator}", *FP32, "steps=2",
                           "credit.mc_samples=2")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    records = trainer.history
    assert [r["step"] for r in records if "time/values" in r] == [1, 2]
    assert all(r["mc/tokens"] > 0 and r["time/values"] > 0 for r in records if "step" in r
               and "time/values" in r)
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters(),
                                                     strict=True))


def test_other_estimators_skip_the_phase(tmp_path) -> None:
    trainer = tiny_trainer(tmp_path / "run", "estimator=grpo", *FP32)
    try:
        record, _ = trainer.step(1)
    finally:
        trainer.close()
    assert "mc/tokens" not in record and record["time/values"] < 0.05


def test_multi_turn_tasks_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="single-turn task"):
        tiny_trainer(tmp_path / "run", "task=sokoban", "train_size=6", "eval.size=2",
                     "estimator=spo_chain", "steps=1", task="config")


@pytest.mark.parametrize("estimator", ["spo_chain", "vineppo"])
def test_trl_refuses_them_by_name_and_verl_runs_them_with_its_values_phase(
        estimator: str) -> None:
    from gear_rl.integrations.trl import trl_estimator
    from gear_rl.integrations.verl.estimators import settings_from_algorithm, verl_estimator_names

    with pytest.raises(ValueError, match=estimator):
        trl_estimator(estimator)
    assert get_estimator(estimator).engine_limit("TRL").startswith("it needs Monte-Carlo")
    # verl: the gear trainer mode's values phase (gear_rl.integrations.verl.values)
    assert estimator in verl_estimator_names()
    settings = settings_from_algorithm({"adv_estimator": estimator,
                                        "gear": {"mc_samples": 3}})
    assert settings.needs_signals and settings.config.mc_samples == 3


def test_the_credit_check_scores_them_on_their_own_continuations(tmp_path, capsys) -> None:
    """The credit check scores SPO-chain and VinePPO like any estimator: each row's values come
    from its own continuations (``monte_carlo_extras``, another random stream than the truth's),
    so its credit is an independent estimate held to the truth; a rerun gives the same scores."""
    import json

    from gear_rl.cli import main

    out = tmp_path / "cc"
    args = ["credit-check", "model=tiny-random", "task=products", "train_size=8",
            "eval.size=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=6",
            "groups=2", "per_group=2", "mixed_only=false", "continuations=3",
            "estimators=grpo,spo_chain,vineppo", "variant.vine2.estimator=vineppo",
            "variant.vine2.credit.mc_samples=2", "progress=false", "bootstrap=20", f"out={out}"]
    assert main(args) == 0
    data = json.loads((out / "credit_check.json").read_text())
    labels = [r["label"] for r in data["scores"]["rows"]]
    assert labels == ["grpo", "spo_chain", "vineppo", "vine2"]
    assert "spo_chain" not in data["skipped"] and "vineppo" not in data["skipped"]
    assert main(args) == 0
    assert json.loads((out / "credit_check.json").read_text())["scores"] == data["scores"]
    capsys.readouterr()
