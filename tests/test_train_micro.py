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
    step, packer = trainer.optimizer.step, trainer.engine.micro_batches

    def spy_step(*args, **kwargs):
        captured.extend(p.grad.detach().clone() for p in trainer.model.parameters())
        return step(*args, **kwargs)

    def spy_pack(batch, minibatch):
        micros.append(packer(batch, minibatch))
        return micros[-1]

    trainer.optimizer.step = spy_step
    trainer.engine.micro_batches = spy_pack
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
        micros = trainer.engine.micro_batches(batch, rows)
        assert sorted(i for m in micros for i in m) == rows
        for micro in micros:
            assert len(micro) <= 5
            cost = backbone_tokens([batch.prompt_ids[i] for i in micro],
                                   [batch.response_ids[i] for i in micro], share_prompts=True)
            assert cost <= 60 or len(micro) == 1
        # rows of one group are consecutive in the packing order
        order = [batch.group_ids[i] for m in micros for i in m]
        assert order == sorted(order, key=order.index)
        assert micros == trainer.engine.micro_batches(batch, rows)  # deterministic
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
        assert trainer.engine.fusion(batch) == mode
        if mode != "before":  # the budget decides how many micro-batches there are
            everything = list(range(len(batch.response_ids)))
            many = len(trainer.engine.micro_batches(batch, everything)) > 1
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


def _half_constant_task():
    """Two problems, both in every step (rollout.prompts_per_step=2): ``fixed``'s reward is
    always 1 (a constant group: outcome advantage 0), ``parity``'s is the toy task's (mixed)."""
    from gear_rl.tasks import Problem, Task

    problems = [Problem(id=name, prompt=[{"role": "user", "content": f"say {name}"}],
                        answer="even", reference="an even number of letters")
                for name in ("fixed", "parity")]

    def scorer(problem, text: str) -> float:
        return 1.0 if problem.id == "fixed" else float(sum(c.islower() for c in text) % 2 == 0)

    return Task(name="half", train=problems, eval=problems, scorer=scorer,
                extract=lambda text: text[:8])


def _backbone_tokens(trainer) -> list[int]:
    """Token positions each backbone call of ``trainer``'s model will run (a forward hook)."""
    seen: list[int] = []
    trainer.model.base_model.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(int(kwargs["input_ids"].numel())),
        with_kwargs=True)
    return seen


@pytest.mark.parametrize(("estimator", "overrides"), [
    ("gear", ()),                                            # fused, one micro-batch
    ("gear", ("loss.micro_batch_tokens=40",)),               # fused, several
    ("gear", ("loss.fuse_scoring=false",)),                  # the no-grad scoring pass
    ("rlsd", ("loss.kl_coef=0.1",)),
])
def test_skipping_the_teacher_on_zero_advantage_rows_keeps_the_update(tmp_path, estimator,
                                                                      overrides) -> None:
    """signals.teacher_rows=nonzero_advantage (the default) runs the teacher on the mixed
    group only, and trains on the gradients of the teacher on every row (``all``)."""
    extra = (f"estimator={estimator}", "loss.micro_batch_size=8", "log.samples_per_step=8",
             *overrides)
    runs = {}
    for rows in ("all", "nonzero_advantage"):
        trainer = tiny_trainer(tmp_path / rows, "seed=0", "precision=fp32",
                               "rollout.dtype=fp32", "rollout.max_new_tokens=12",
                               f"signals.teacher_rows={rows}", *extra,
                               task=_half_constant_task())
        grads: list[torch.Tensor] = []
        step = trainer.optimizer.step

        def spy_step(*args, trainer=trainer, grads=grads, step=step, **kwargs):
            grads.extend(p.grad.detach().clone() for p in trainer.model.parameters())
            return step(*args, **kwargs)

        trainer.optimizer.step = spy_step
        tokens = _backbone_tokens(trainer)
        try:
            record, out = trainer.step(1)
            samples = trainer.samples(out, 1)
        finally:
            trainer.close()
        runs[rows] = (grads, sum(tokens), record, out, samples)
    (want, all_tokens, want_record, every, _), (got, tokens, record, skip, samples) = (
        runs["all"], runs["nonzero_advantage"])
    fixed = torch.tensor([p.id == "fixed" for p in every.batch.problems])
    rewards = every.batch.rewards
    assert bool(fixed.any()) and float(rewards[~fixed].max()) > float(rewards[~fixed].min())
    assert every.scores.teacher_rows is None
    assert torch.equal(skip.scores.teacher_rows, ~fixed)
    # the skipped rows have no teacher signals; the teacher's rows have the same ones
    assert (skip.scores.divergence[fixed] == 0).all()
    assert (every.scores.divergence[fixed] != 0).any()
    for field in ("divergence", "teacher_logprobs", "old_logprobs", "entropy"):
        torch.testing.assert_close(getattr(skip.scores, field)[~fixed],
                                   getattr(every.scores, field)[~fixed], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(skip.advantages, every.advantages, atol=1e-6, rtol=1e-5)
    assert (skip.advantages[fixed] == 0).all()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
    assert any(float(w.abs().max()) > 1e-3 for w in want)
    # the backbone ran fewer tokens: the constant group's teacher prompts and responses
    assert tokens < all_tokens
    # the divergence numbers cover the teacher's rows only
    taught = (every.scores.mask > 0) & ~fixed[:, None]
    assert record["divergence_mean"] == pytest.approx(
        float(every.scores.divergence.double()[taught].mean()), rel=1e-5)
    assert record["loss"] == pytest.approx(want_record["loss"], rel=1e-4, abs=1e-6)
    for sample in samples:
        skipped = sample["problem_id"] == "fixed"
        assert (sample["divergence"] is None) == skipped
        assert (sample["teacher_logprobs"] is None) == skipped
        if estimator == "gear":
            assert (sample["segment_onset"] is None) == skipped


def test_the_teacher_runs_on_every_row_where_its_signals_reach_the_loss(tmp_path) -> None:
    """Self-distillation reads the teacher on every row, and a GRPO-type credit never skips
    because its outcome is not all it reads: teacher_rows is None there."""
    for overrides in (("estimator=opsd",), ("estimator=grpo", "loss.opsd_coef=0.5"),
                      ("estimator=gear", "signals.teacher_rows=all")):
        trainer = tiny_trainer(tmp_path / "_".join(overrides), *overrides,
                               task=_half_constant_task())
        try:
            assert trainer.scorer.teacher_rows(trainer.rollout(1)) is None
        finally:
            trainer.close()
