"""Numbers the trainer must keep: golden values of the first steps (for every micro-batch size),
the hand-off from the registry to the loss for every registered estimator, and an estimator
from outside the package trained from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import gear_rl.train.update as trainer_module
from conftest import tiny_trainer
from gear_rl.credit import CreditBatch, estimator_names, get_estimator

pytestmark = pytest.mark.usefixtures("one_thread")

# Recorded on 2026-12-01 (tiny Llama seed 1, toy task, seed 0, fp32 compute and sampling, one
# thread): step 1 and step 2 of each estimator. The GRPO loss of an on-policy first update is a
# token mean of centred advantages, i.e. 0 up to rounding, so losses are held to 1e-6 absolute.
GOLDEN = {
    "grpo": [
        {"reward_mean": 0.5, "adv_abs_mean": 0.8660238981246948, "loss": 0.0,
         "grad_norm": 5.426974296569824, "weight_mean_pos": 1.0, "weight_mean_neg": 1.0},
        {"reward_mean": 0.125, "adv_abs_mean": 0.3749992251396179, "loss": 0.0,
         "grad_norm": 4.476151466369629, "weight_mean_pos": 1.0, "weight_mean_neg": 1.0},
    ],
    # recorded with GEAR's default of that day, the paper-literal reading (mean_preserving off,
    # the default since issue 39): ARGS pins it
    "gear": [
        {"reward_mean": 0.5, "adv_abs_mean": 0.8534805178642273, "loss": -0.169234961271286,
         "grad_norm": 5.4895195960998535, "weight_mean_pos": 1.1809321227821798,
         "weight_mean_neg": 0.7900999761175047, "segment_frac": 0.949999988079071},
        {"reward_mean": 0.25, "adv_abs_mean": 0.7804638147354126, "loss": -0.19272743165493011,
         "grad_norm": 8.972634315490723, "weight_mean_pos": 1.2975910456797393,
         "weight_mean_neg": 0.7836500263671614, "segment_frac": 0.949999988079071},
    ],
}
EXACT = ("reward_mean",)
FP32 = ("seed=0", "precision=fp32", "rollout.dtype=fp32", "log.samples_per_step=0")
ARGS = {"grpo": (), "gear": ("credit.mean_preserving=false",)}


@pytest.mark.parametrize("micro_batch_size", [1, 3, 16])
@pytest.mark.parametrize("estimator", sorted(GOLDEN))
def test_first_steps_match_recorded_values(tmp_path, estimator: str,
                                           micro_batch_size: int) -> None:
    trainer = tiny_trainer(tmp_path / "run", f"estimator={estimator}", *FP32, *ARGS[estimator],
                           f"loss.micro_batch_size={micro_batch_size}")
    trainer.train()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(logged) == len(GOLDEN[estimator])
    for step, (record, expected) in enumerate(zip(logged, GOLDEN[estimator], strict=True), 1):
        for key, value in expected.items():
            if key in EXACT:
                assert record[key] == value, (step, key)
            elif key == "loss":
                assert record[key] == pytest.approx(value, abs=1e-6), (step, key)
            else:
                assert record[key] == pytest.approx(value, rel=1e-4), (step, key)


def test_default_gear_keeps_the_paper_segments_with_mean_weight_one(tmp_path) -> None:
    """GEAR's default (mean_preserving, issue 39) on the golden run: the rollouts and segments
    of the paper-literal reading (same rewards, same share of tokens in segments), and a mean
    weight of 1 on each sign, where the paper's reading has the recorded asymmetry."""
    trainer = tiny_trainer(tmp_path / "run", "estimator=gear", *FP32)
    trainer.train()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(logged) == 2
    first, expected = logged[0], GOLDEN["gear"][0]
    assert first["reward_mean"] == expected["reward_mean"]
    assert first["segment_frac"] == pytest.approx(expected["segment_frac"], rel=1e-6)
    assert first["weight_mean_pos"] == pytest.approx(1.0, abs=1e-5)
    assert first["weight_mean_neg"] == pytest.approx(1.0, abs=1e-5)
    assert abs(expected["weight_mean_pos"] - 1) > 0.1  # the asymmetry it removes


def _run_step(trainer, monkeypatch) -> tuple:
    """One step with the PPO loss wrapped: returns the step output and the ``[B, T]``
    advantages the loss received, reassembled row by row from the micro-batches."""
    received: list[torch.Tensor] = []
    original = trainer_module.ppo_policy_loss

    def spy(logprobs, old_logprobs, advantages, mask, **kwargs):
        received.append(advantages.detach().clone())
        return original(logprobs, old_logprobs, advantages, mask, **kwargs)

    monkeypatch.setattr(trainer_module, "ppo_policy_loss", spy)
    _, output = trainer.step(1)
    return output, received


def _by_hand(output, estimator, config) -> torch.Tensor:
    """The registry function on a CreditBatch assembled here from the step's own fields."""
    batch, scores = output.batch, output.scores
    return estimator(CreditBatch(
        rewards=batch.rewards, group_ids=batch.group_ids, mask=scores.mask,
        divergence=scores.divergence, entropy=scores.entropy,
        student_logprobs=scores.old_logprobs, teacher_logprobs=scores.teacher_logprobs,
        extras=batch.extras or {}), config).float()


@pytest.mark.parametrize("name", estimator_names())
def test_trainer_trains_on_exactly_the_registry_advantages(tmp_path, monkeypatch,
                                                           name: str) -> None:
    estimator = get_estimator(name)
    if estimator.step_level:
        trainer = tiny_trainer(tmp_path / "run", "task=sokoban", f"estimator={name}",
                               "train_size=4", "eval.size=2", "rollout.samples_per_prompt=2",
                               "agent.max_turns=2", "agent.max_new_tokens_per_turn=4",
                               "agent.max_response_tokens=300", "loss.micro_batch_size=3",
                               task="config")
    else:
        trainer = tiny_trainer(tmp_path / "run", f"estimator={name}", "loss.micro_batch_size=3")
    try:
        output, received = _run_step(trainer, monkeypatch)
    finally:
        trainer.close()
    expected = _by_hand(output, estimator, trainer.credit_config)
    torch.testing.assert_close(output.advantages, expected, rtol=0, atol=0)
    rows = len(output.batch.response_ids)
    if not estimator.uses_reward:
        assert received == [] and (output.advantages == 0).all()
        return
    # one mini-batch in row order, micro-batches of 3: concatenating them gives the batch back
    assert [r.shape[0] for r in received] == [min(3, rows - s) for s in range(0, rows, 3)]
    width = max(r.shape[1] for r in received)
    handed = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in received])
    torch.testing.assert_close(handed, expected[:, :width], rtol=0, atol=0)
    assert (expected[:, width:] == 0).all()


PLUGIN = textwrap.dedent('''
    """A credit estimator that lives outside gear-rl: GRPO's advantage on the last half of
    each response's policy tokens, 0 on the first half."""
    import torch

    from gear_rl.credit import OutcomeConfig, outcome_advantages, register_estimator


    @register_estimator("late_half_test", config=OutcomeConfig, paper="none (a test)",
                        description="GRPO on the second half of each response")
    def late_half(batch, config):
        mask = batch.mask.float()
        position = mask.cumsum(1)
        late = (position > mask.sum(1, keepdim=True) / 2).float() * mask
        return outcome_advantages(batch, config)[:, None] * late
''')


def test_plugin_estimator_trains_from_the_cli(tmp_path) -> None:
    (tmp_path / "plugin_pkg").mkdir()
    (tmp_path / "plugin_pkg" / "__init__.py").write_text("")
    (tmp_path / "plugin_pkg" / "late_half.py").write_text(PLUGIN)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    args = ["model=tiny-random", "task=arithmetic", "train_size=16", "steps=1",
            "plugins=[plugin_pkg.late_half]", "estimator=late_half_test",
            "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=8", "eval.size=2", "eval.k=1", "eval.at_start=false",
            "eval.max_new_tokens=4", "log.progress=false", "log.report_to=none",
            "threads=1", f"out={out}"]
    done = subprocess.run([sys.executable, "-m", "gear_rl.cli", "train", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 1 and "loss" in record
    # the run is resumable with its plugin: the saved config names it
    assert "plugin_pkg.late_half" in (out / "config.yaml").read_text()
    # without plugins= the name is unknown, and the error says how to load it
    bad = subprocess.run([sys.executable, "-m", "gear_rl.cli", "train", *args[:4], *args[5:]],
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode != 0 and "plugins=" in bad.stderr
