"""The update's micro-batches: token-budgeted packing and the shared-prompt pass change memory
and speed, never the gradient (up to float rounding), for every loss aggregation mode."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_trainer
from gear_rl.signals import backbone_tokens
from gear_rl.train.records import is_measurement

pytestmark = pytest.mark.usefixtures("one_thread")

# Reference: every row alone, no sharing (the plainest gradient accumulation there is).
PLAIN = ("loss.share_prompts=false", "loss.micro_batch_size=1")


def _step_gradients(tmp_path, name: str, *overrides: str) -> tuple[list[torch.Tensor], list]:
    """Run step 1 and return the parameter gradients at the optimiser step and the
    micro-batches the update used."""
    trainer = tiny_trainer(tmp_path / name, "seed=0", "precision=fp32", "rollout.dtype=fp32",
                           "rollout.max_new_tokens=12", *overrides)
    captured: list[torch.Tensor] = []
    micros: list[list[list[int]]] = []
    step, packer = trainer.optimizer.step, trainer._micro_batches

    def spy_step(*args, **kwargs):
        captured.extend(p.grad.detach().clone() for p in trainer.model.parameters())
        return step(*args, **kwargs)

    def spy_pack(batch, minibatch):
        micros.append(packer(batch, minibatch))
        return micros[-1]

    trainer.optimizer.step = spy_step
    trainer._micro_batches = spy_pack
    try:
        trainer.step(1)
    finally:
        trainer.close()
    return captured, micros


@pytest.mark.parametrize(("estimator", "agg"), [
    ("gear", "token-mean"), ("gear", "seq-mean-token-sum"), ("gear", "seq-mean-token-mean"),
    ("gear", "seq-mean-token-sum-norm"), ("opsd", "token-mean")])
def test_shared_and_packed_updates_give_the_plain_gradients(tmp_path, agg: str,
                                                            estimator: str) -> None:
    extra = (f"loss.agg_mode={agg}", f"estimator={estimator}", "loss.kl_coef=0.1")
    want, plain_micros = _step_gradients(tmp_path, "plain", *extra, *PLAIN)
    assert all(len(m) == 1 for m in plain_micros[0])
    for name, overrides in [("default", ()), ("tight", ("loss.micro_batch_tokens=40",)),
                            ("unshared", ("loss.share_prompts=false",))]:
        got, micros = _step_gradients(tmp_path, name, *extra, *overrides)
        if name == "tight":  # the budget split the groups: some prompt runs in two micro-batches
            assert len(micros[0]) > 2
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4,
                                       msg=lambda m, n=name: f"{n}: {m}")
    assert any(float(w.abs().max()) > 1e-3 for w in want)


def test_packing_respects_the_budget_and_keeps_groups_together(tmp_path) -> None:
    trainer = tiny_trainer(tmp_path / "run", "rollout.max_new_tokens=12",
                           "loss.micro_batch_tokens=60", "loss.micro_batch_size=5")
    try:
        batch = trainer.rollout(1)
        rows = list(range(len(batch.response_ids)))
        micros = trainer._micro_batches(batch, rows)
        assert sorted(i for m in micros for i in m) == rows
        for micro in micros:
            assert len(micro) <= 5
            cost = backbone_tokens([batch.prompt_ids[i] for i in micro],
                                   [batch.response_ids[i] for i in micro], share_prompts=True)
            assert cost <= 60 or len(micro) == 1
        # rows of one group are consecutive in the packing order
        order = [batch.group_ids[i] for m in micros for i in m]
        assert order == sorted(order, key=order.index)
        assert micros == trainer._micro_batches(batch, rows)  # deterministic
    finally:
        trainer.close()


@pytest.mark.parametrize(("estimator", "overrides", "mode"), [
    ("grpo", (), "before"),                                   # credit reads no student signal
    ("gear", ("loss.micro_batch_size=8",), "inline"),         # credit between forward/backward
    ("rlsd", ("loss.kl_coef=0.1", "loss.micro_batch_size=8"), "inline"),
    # several micro-batches: a row-local estimator's credit runs per micro-batch...
    ("gear", ("loss.micro_batch_size=8", "loss.micro_batch_tokens=40"), "inline"),
    ("rlsd", ("loss.micro_batch_size=8", "loss.micro_batch_tokens=40"), "inline"),
    # ... one that reads across rows (the batch's top entropy tokens) needs the scoring pass
    ("top_entropy", ("loss.micro_batch_size=8", "loss.micro_batch_tokens=40"), None),
    ("grpo", ("loss.opsd_coef=0.5",), "before"),              # + self-distillation
])
def test_fused_scoring_gives_the_scoring_pass_gradients(tmp_path, estimator, overrides,
                                                        mode) -> None:
    """The on-policy update that stands in for the scoring pass (loss.fuse_scoring) trains on
    the same gradients and logs the same signals as the separate no-grad pass."""
    extra = (f"estimator={estimator}", *overrides)
    want, _ = _step_gradients(tmp_path, "scored", *extra, "loss.fuse_scoring=false")
    trainer = tiny_trainer(tmp_path / "probe", "seed=0", "precision=fp32", "rollout.dtype=fp32",
                           "rollout.max_new_tokens=12", *extra)
    try:
        batch = trainer.rollout(1)
        assert trainer._fused_mode(batch) == mode
        if mode != "before":  # the budget decides how many micro-batches there are
            many = len(trainer._micro_batches(batch, list(range(len(batch.response_ids))))) > 1
            assert many == ("loss.micro_batch_tokens=40" in overrides)
    finally:
        trainer.close()
    got, _ = _step_gradients(tmp_path, "fused", *extra)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("budget", [(), ("loss.micro_batch_tokens=40",)])
def test_fused_scores_equal_the_scoring_pass(tmp_path, budget) -> None:
    """Same signals, advantages and metrics, with one micro-batch or several (the per
    micro-batch credit of a row-local estimator)."""
    common = ("seed=0", "precision=fp32", "rollout.dtype=fp32", "loss.micro_batch_size=8",
              *budget)
    fused = tiny_trainer(tmp_path / "fused", *common)
    plain = tiny_trainer(tmp_path / "plain", *common, "loss.fuse_scoring=false")
    try:
        record, out = fused.step(1)
        plain_record, plain_out = plain.step(1)
        for field in ("old_logprobs", "entropy", "divergence", "teacher_logprobs", "mask"):
            torch.testing.assert_close(getattr(out.scores, field),
                                       getattr(plain_out.scores, field), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.advantages, plain_out.advantages, atol=1e-5, rtol=1e-5)
        assert record["clip_frac"] == 0.0 and record["approx_kl"] == 0.0
        assert record["entropy_mean"] == pytest.approx(plain_record["entropy_mean"], rel=1e-5)
        assert abs(out.scores.entropy).sum() > 0
        for key, value in plain_record.items():  # every logged number but the timings
            if isinstance(value, float) and not is_measurement(key):
                assert record[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    finally:
        fused.close()
        plain.close()
