"""Top-entropy (80/20) and RLSD against short re-statements of their authors' code on random
inputs, and the trainer's per-micro-batch top-entropy selection on a tiny model.

The re-statements follow, in plain torch:
- Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR, ``verl/trainer/ppo/core_algos.py``
  ``get_global_entropy_top_mask`` (flatten, keep the response tokens, ``torch.topk`` of
  ``k = max(1, int(n * ratio + 0.9999))``, scatter back);
- iie-ycx/RLSD, ``verl/workers/actor/dp_opsd_actor.py`` ``_build_stgca_advantages`` (on verl's
  ``[B, T]`` advantages) and the ``effective_lambda`` schedule of
  ``verl/trainer/opsd_trainer.py``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import gear_rl.train.update as trainer_module
from conftest import tiny_trainer
from gear_rl.credit import (
    CreditBatch,
    RLSDConfig,
    TopEntropyConfig,
    get_estimator,
    outcome_advantages,
)
from gear_rl.credit.token import (
    rlsd_advantages,
    rlsd_lambda,
    top_entropy_advantages,
    top_entropy_count,
    top_entropy_mask,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ the authors, re-stated
def authors_top_mask(entropy: torch.Tensor, response_mask: torch.Tensor,
                     top_ratio: float) -> torch.Tensor:
    flat_entropy, flat_mask = entropy.flatten(), response_mask.flatten().bool()
    values = flat_entropy[flat_mask]
    out = torch.zeros_like(flat_entropy, dtype=torch.long)
    if values.numel() == 0:
        return out.view_as(entropy)
    k = max(1, int(len(values) * top_ratio + 0.9999))
    picked = torch.topk(values, k=k).indices
    out[flat_mask.nonzero().squeeze(1)[picked]] = 1
    return out.view_as(entropy)


def authors_rlsd(teacher: torch.Tensor, student: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor, lam: float, clip: float,
                 negative_only: bool, thought_mask: torch.Tensor | None) -> torch.Tensor:
    """On verl's ``[B, T]`` advantages (the trajectory's A on each response token)."""
    sign = torch.sign(advantages)
    delta = (teacher - student) * response_mask
    weights = torch.exp(sign * delta) * response_mask
    reweight = ((1.0 - lam) + lam * weights.clamp(1.0 - clip, 1.0 + clip)) * response_mask
    if negative_only:
        negative = (advantages.sum(dim=-1, keepdim=True) < 0).double()
        reweight = negative * reweight + (1.0 - negative) * response_mask
    if thought_mask is not None:
        reweight = thought_mask * reweight + (1.0 - thought_mask) * response_mask
    return advantages * reweight


def authors_lambda(target: float, global_step: int, warmup: int, decay: int) -> float:
    if warmup > 0 and global_step < warmup:
        return target * (global_step / warmup)
    if decay > 0 and global_step >= warmup:
        return target * max(1.0 - (global_step - warmup) / decay, 0.0)
    return target


# ------------------------------------------------------------------ top-entropy
def test_top_entropy_mask_equals_the_authors_on_random_inputs() -> None:
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows, length = 1 + trial % 7, 1 + trial % 23
        entropy = torch.rand(rows, length, generator=generator, dtype=torch.float64) * 3
        mask = (torch.rand(rows, length, generator=generator) < 0.8).float()
        rho = [0.2, 0.05, 0.5, 0.33, 1.0, 0.7][trial % 6]
        ours = top_entropy_mask(entropy, mask, rho=rho)
        theirs = authors_top_mask(entropy, mask, rho).bool()
        assert torch.equal(ours, theirs), trial
        n = int(mask.sum())
        assert int(ours.sum()) == (max(1, int(n * rho + 0.9999)) if n else 0)


def test_ties_at_the_cut_keep_exactly_k_earliest_first() -> None:
    # 85% of the entropies are exactly 0: the old >= cut rule kept all 200 tokens
    generator = torch.Generator().manual_seed(3)
    entropy = torch.zeros(4, 50)
    hot = torch.randperm(200, generator=generator)[:30]
    entropy.view(-1)[hot] = torch.rand(30, generator=generator) + 0.1
    mask = torch.ones(4, 50)
    ours = top_entropy_mask(entropy, mask, rho=0.2)
    theirs = authors_top_mask(entropy, mask, 0.2).bool()
    assert int(ours.sum()) == int(theirs.sum()) == 40 == math.ceil(0.2 * 200)
    # the same multiset of kept values as torch.topk; which tied zero it keeps is ours to fix
    assert torch.equal(entropy[ours].sort().values, entropy[theirs].sort().values)
    assert bool(ours.view(-1)[hot].all())
    zeros_kept = (ours & (entropy == 0)).view(-1).nonzero().squeeze(1)
    all_zeros = (entropy == 0).view(-1).nonzero().squeeze(1)
    assert torch.equal(zeros_kept, all_zeros[:10])  # row-major position order
    adv = torch.tensor([1.0, -1.0, 2.0, 0.5])
    out = top_entropy_advantages(adv, entropy, mask, rho=0.2)
    assert int((out != 0).sum()) == 40


def test_keep_count_rounds_like_the_authors() -> None:
    assert 0.28 * 25 > 7  # float noise: math.ceil would keep 8
    assert top_entropy_count(25, 0.28) == 7 == int(authors_top_mask(
        torch.rand(1, 25), torch.ones(1, 25), 0.28).sum())
    assert top_entropy_count(8, 0.2) == 2 and top_entropy_count(3, 0.01) == 1
    assert top_entropy_count(0, 0.2) == 0 and top_entropy_count(7, 1.0) == 7


def test_micro_batch_selection_is_declared_and_refused_where_not_applied() -> None:
    estimator = get_estimator("top_entropy")
    generator = torch.Generator().manual_seed(5)
    mask = torch.ones(6, 9)
    mask[1, 4:] = 0
    entropy = torch.rand(6, 9, generator=generator)
    config = estimator.make_config(selection="micro_batch", rho=0.3)
    selected = estimator.select_for_update(entropy, mask, config)
    assert selected is not None
    assert torch.equal(selected, authors_top_mask(entropy, mask, 0.3).bool())
    assert estimator.update_token_count(mask, config) == top_entropy_count(int(mask.sum()), 0.3)
    assert estimator.select_for_update(entropy, mask, estimator.make_config()) is None
    assert get_estimator("grpo").update_token_count(mask, get_estimator("grpo").make_config()) \
        is None
    batch = CreditBatch(rewards=torch.tensor([1.0, 0, 1, 0, 1, 1]), group_ids=[0] * 6,
                        mask=mask, entropy=entropy)
    with pytest.raises(ValueError, match="selects tokens in the policy update"):
        estimator(batch, config)
    batch.applies_update_mask = True
    out = estimator(batch, config)
    outcome = get_estimator("grpo")(batch)
    torch.testing.assert_close(out, outcome)  # every token keeps A; the update selects
    with pytest.raises(ValueError, match="selection must be one of"):
        TopEntropyConfig(selection="minibatch")


def test_trainer_selects_per_micro_batch_and_normalises_over_selected(tmp_path,
                                                                      monkeypatch) -> None:
    calls: list[dict] = []
    original = trainer_module.ppo_policy_loss

    def spy(logprobs, old_logprobs, advantages, mask, **kwargs):
        loss, stats = original(logprobs, old_logprobs, advantages, mask, **kwargs)
        calls.append({"mask": mask.detach().clone(), "num_tokens": kwargs["num_tokens"],
                      "advantages": advantages.detach().clone(), "loss": float(loss.detach()),
                      "logprobs": logprobs.detach().clone(),
                      "old": old_logprobs.detach().clone()})
        return loss, stats

    monkeypatch.setattr(trainer_module, "ppo_policy_loss", spy)
    trainer = tiny_trainer(tmp_path / "run", "estimator=top_entropy",
                           "credit.selection=micro_batch", "steps=1", "seed=0",
                           "precision=fp32", "rollout.dtype=fp32", "loss.micro_batch_size=3")
    outputs: list = []
    step = trainer.step
    monkeypatch.setattr(trainer, "step", lambda s: outputs.append(step(s)) or outputs[-1])
    trainer.train()
    _, output = outputs[0]
    scores, rows = output.scores, len(output.batch.response_ids)
    micros = [list(range(s, min(s + 3, rows))) for s in range(0, rows, 3)]
    assert len(calls) == len(micros)  # one mini-batch, one epoch
    # credit keeps A on every policy token; the update keeps ceil(rho * n) per micro-batch
    assert int((output.advantages != 0).sum()) == int(
        ((output.advantages != 0) & (scores.mask > 0)).sum())
    counts = [top_entropy_count(int(scores.mask[m].sum()), 0.2) for m in micros]
    assert [int(c["mask"].sum()) for c in calls] == counts
    assert all(c["num_tokens"] == float(sum(counts)) for c in calls)
    assert sum(counts) < float(scores.mask.sum()) * 0.3
    # the first update is on-policy: the current entropy is the scoring pass's
    for call, micro in zip(calls, micros, strict=True):
        width = call["mask"].shape[1]
        expected = top_entropy_mask(scores.entropy[micro, :width], scores.mask[micro, :width],
                                    rho=0.2)
        assert torch.equal(call["mask"].bool(), expected)
    # pg_loss is the token mean over the selected tokens of the mini-batch (not over all)
    manual = 0.0
    for call in calls:
        ratio = torch.exp(call["logprobs"] - call["old"])
        per_token = torch.maximum(-call["advantages"] * ratio,
                                  -call["advantages"] * ratio.clamp(0.8, 1.28))
        manual += float((per_token * call["mask"]).sum()) / sum(counts)
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["pg_loss"] == pytest.approx(manual, abs=1e-6)
    assert record["pg_loss"] == pytest.approx(sum(c["loss"] for c in calls), abs=1e-6)
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0


# ------------------------------------------------------------------ RLSD
def test_rlsd_equals_the_authors_on_random_inputs() -> None:
    generator = torch.Generator().manual_seed(1)
    worst = 0.0
    for trial in range(60):
        rows, length = 2 + trial % 6, 3 + trial % 17
        mask = (torch.rand(rows, length, generator=generator) < 0.85).double()
        student = -torch.rand(rows, length, generator=generator, dtype=torch.float64) * 4
        teacher = student + torch.randn(rows, length, generator=generator,
                                        dtype=torch.float64) * 0.5
        adv = torch.randn(rows, generator=generator, dtype=torch.float64)
        adv[0] = 0.0
        lam = float(torch.rand(1, generator=generator))
        clip = 0.05 + 0.3 * float(torch.rand(1, generator=generator))
        thought = (torch.rand(rows, length, generator=generator) < 0.5).double() * mask
        for negative_only in (False, True):
            for thought_mask in (None, thought):
                ours = rlsd_advantages(adv, student, teacher, mask, lam=lam, eps_w=clip,
                                       negative_only=negative_only, thought_mask=thought_mask)
                theirs = authors_rlsd(teacher, student, adv[:, None] * mask, mask, lam, clip,
                                      negative_only, thought_mask)
                worst = max(worst, float((ours - theirs).abs().max()))
    assert worst < 1e-12, worst


def test_rlsd_lambda_schedule_equals_the_authors() -> None:
    for warmup, decay in ((0, 60), (10, 60), (10, 0), (0, 0), (5, 3)):
        for step in range(1, 90):
            ours = rlsd_lambda(0.5, step, warmup_steps=warmup or None,
                               decay_steps=decay or None)
            assert ours == pytest.approx(authors_lambda(0.5, step, warmup, decay), abs=1e-15)
    # the launch script's 60-step decay: step 1 already below lam, 0 from step 60 on
    assert rlsd_lambda(0.5, 1, decay_steps=60) == pytest.approx(0.5 * 59 / 60)
    assert rlsd_lambda(0.5, 60, decay_steps=60) == 0.0 == rlsd_lambda(0.5, 75, decay_steps=60)
    assert rlsd_lambda(0.5, None) == 0.5


def rlsd_batch(step: int | None = None, **extras) -> CreditBatch:
    generator = torch.Generator().manual_seed(2)
    student = -torch.rand(4, 6, generator=generator) * 3
    return CreditBatch(rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), group_ids=[0, 0, 1, 1],
                       mask=torch.ones(4, 6), student_logprobs=student,
                       teacher_logprobs=student + torch.randn(4, 6, generator=generator),
                       step=step, extras=dict(extras))


def test_rlsd_estimator_knobs() -> None:
    rlsd, grpo = get_estimator("rlsd"), get_estimator("grpo")
    batch = rlsd_batch()
    a = grpo(batch)[:, 0]
    assert torch.equal(rlsd(batch), rlsd_advantages(a, batch.student_logprobs,
                                                    batch.teacher_logprobs, batch.mask))
    decay = rlsd.make_config(lam_decay_steps=60)
    with pytest.raises(ValueError, match="need the training step"):
        rlsd(batch, decay)
    late = rlsd_batch(step=30)
    torch.testing.assert_close(rlsd(late, decay), rlsd_advantages(
        a, late.student_logprobs, late.teacher_logprobs, late.mask, lam=0.25))
    torch.testing.assert_close(rlsd(rlsd_batch(step=60), decay), a[:, None] * batch.mask)
    negative = rlsd(batch, rlsd.make_config(negative_only=True))
    assert torch.equal(negative[a > 0], (a[:, None] * batch.mask)[a > 0])
    assert not torch.equal(negative[a < 0], (a[:, None] * batch.mask)[a < 0])
    with pytest.raises(ValueError, match="thought_mask"):
        rlsd(batch, rlsd.make_config(thought_only=True))
    thought = torch.zeros(4, 6)
    thought[:, 1:4] = 1
    inside = rlsd(rlsd_batch(thought_mask=thought), rlsd.make_config(thought_only=True))
    full = rlsd(batch)
    torch.testing.assert_close(inside[:, 1:4], full[:, 1:4])
    torch.testing.assert_close(inside[:, [0, 4, 5]], (a[:, None] * batch.mask)[:, [0, 4, 5]])
    for bad in ({"lam_decay_steps": 0}, {"lam_warmup_steps": True}, {"negative_only": 1}):
        with pytest.raises(ValueError):
            RLSDConfig(**bad)


def test_trainer_credit_hands_the_step_to_rlsd(tmp_path) -> None:
    trainer = tiny_trainer(tmp_path / "run", "estimator=rlsd", "credit.lam_decay_steps=60")
    try:
        batch = trainer.rollout(1)
        scores = trainer.score(batch)
        with pytest.raises(ValueError, match="need the training step"):
            trainer.credit(batch, scores)
        got = trainer.credit(batch, scores, step=30)
    finally:
        trainer.close()
    a = outcome_advantages(scores.credit_batch(batch), RLSDConfig())
    expected = rlsd_advantages(a, scores.old_logprobs, scores.teacher_logprobs, scores.mask,
                               lam=0.5 * (1 - 30 / 60))
    torch.testing.assert_close(got, expected.float())


def test_the_trainer_hands_the_step_to_a_scheduled_estimator(tmp_path) -> None:
    from conftest import tiny_trainer

    trainer = tiny_trainer(tmp_path / "run", "estimator=rlsd", "credit.lam_decay_steps=60",
                           "steps=1")
    trainer.train()  # the RLSD schedule needs the step: it would raise without it
    assert trainer.run.read_metrics()[-1]["step"] == 1
