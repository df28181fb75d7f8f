"""GRPO / Dr.GRPO by hand, against verl when installed, and the estimator registry."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from gear_rl.credit import (
    ESTIMATORS,
    CreditBatch,
    GEARConfig,
    OutcomeConfig,
    estimator_names,
    gear_advantages,
    get_estimator,
    grpo_advantages,
    load_plugins,
    register_estimator,
    registry,
    rlsd_advantages,
    top_entropy_advantages,
)


def test_grpo_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    groups = ["p", "p", "p", "q", "q", "r"]
    out = grpo_advantages(rewards, groups)
    # group p: mean 1/3, unbiased std sqrt(1/3)
    std_p = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert out[:3].tolist() == pytest.approx([(2 / 3) / (std_p + 1e-6), (-1 / 3) / (std_p + 1e-6),
                                              (-1 / 3) / (std_p + 1e-6)])
    assert out[3:5].tolist() == [0.0, 0.0]  # zero variance
    assert out[5].item() == 0.0  # a group of one has no baseline
    dr = grpo_advantages(rewards, groups, norm_by_std=False)
    assert dr.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_group_ids_as_tensor_and_interleaved() -> None:
    rewards = torch.tensor([1.0, 3.0, 2.0, 5.0])
    by_list = grpo_advantages(rewards, ["a", "b", "a", "b"])
    by_tensor = grpo_advantages(rewards, torch.tensor([7, 9, 7, 9]))
    assert torch.equal(by_list, by_tensor)
    assert by_list[0] < 0 < by_list[2] and by_list[1] < 0 < by_list[3]
    assert grpo_advantages(torch.zeros(0), []).shape == (0,)


def test_constant_large_group_is_exactly_zero() -> None:
    out = grpo_advantages(torch.full((7,), 0.1), [0] * 7)
    assert torch.equal(out, torch.zeros(7))


def test_grpo_equals_verl() -> None:
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np

    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        groups = 1 + trial % 5
        size = 2 + trial % 4
        rewards = torch.randint(0, 3, (groups * size,), generator=generator).float() / 2
        index = np.array([f"u{i // size}" for i in range(groups * size)], dtype=object)
        length = 6
        mask = torch.ones(groups * size, length)
        token_rewards = torch.zeros(groups * size, length)
        token_rewards[:, -1] = rewards
        for norm in (True, False):
            verl_adv, _ = core_algos.compute_grpo_outcome_advantage(
                token_rewards, mask, index, norm_adv_by_std_in_grpo=norm)
            ours = grpo_advantages(rewards, list(index), norm_by_std=norm)
            assert torch.allclose(verl_adv[:, 0], ours, atol=1e-5), (trial, norm)


def test_top_entropy_keeps_top_fraction_of_policy_tokens() -> None:
    entropy = torch.tensor([[0.1, 0.9, 0.3, 5.0, 0.2], [0.8, 0.4, 0.5, 0.6, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 1], [1, 1, 1, 1, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    # 8 policy tokens, rho .2 -> ceil(1.6) = 2 kept: 0.9 and 0.8 (the masked 5.0 does not count)
    out = top_entropy_advantages(adv, entropy, mask, rho=0.2)
    assert out.tolist() == [[0, 2.0, 0, 0, 0], [-1.0, 0, 0, 0, 0]]
    all_kept = top_entropy_advantages(adv, entropy, mask, rho=1.0)
    assert torch.equal(all_kept, adv[:, None] * mask)
    # ties at the cut: exactly ceil(rho * n) kept, the earlier tokens first
    flat = torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    tied = top_entropy_advantages(adv, flat, torch.ones(2, 5), rho=0.3)
    assert tied.tolist() == [[2.0, 2.0, 2.0, 0, 0], [0, 0, 0, 0, 0]]


def test_rlsd_by_hand() -> None:
    student = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -2.0, -1.0]])
    teacher = torch.tensor([[-0.5, -3.0, -0.9], [-0.5, -3.0, -0.9]])
    adv = torch.tensor([1.0, -1.0])
    out = rlsd_advantages(adv, student, teacher, torch.tensor([[1, 1, 1], [1, 1, 0.0]]))
    inside = 0.5 + 0.5 * math.exp(0.1)
    assert out[0].tolist() == pytest.approx([1.1, 0.9, inside])
    # A < 0: the ratio uses exp(-gap), and the masked token is 0
    assert out[1].tolist() == pytest.approx([-0.9, -1.1, 0.0])


def synthetic_batch(rows: int = 8, length: int = 10) -> CreditBatch:
    generator = torch.Generator().manual_seed(1)
    mask = torch.ones(rows, length)
    mask[0, 3:5] = 0
    mask[1, 7:] = 0
    student = -torch.rand(rows, length, generator=generator) * 3
    return CreditBatch(
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])[:rows],
        group_ids=[i // 4 for i in range(rows)],
        mask=mask,
        divergence=torch.rand(rows, length, generator=generator),
        entropy=torch.rand(rows, length, generator=generator) * 2,
        student_logprobs=student,
        teacher_logprobs=student + torch.randn(rows, length, generator=generator) * 0.3,
    )


# Monte-Carlo credit (spo_chain, vineppo) needs its values in extras and does not keep the
# trajectory's sign (a segment of a success can lower its value): tests/test_credit_mc.py
@pytest.mark.parametrize("name", [n for n in estimator_names(step_level=False)
                                  if get_estimator(n).mc_boundaries is None])
def test_every_estimator_runs_through_the_registry(name: str) -> None:
    batch = synthetic_batch()
    out = get_estimator(name)(batch)
    assert out.shape == batch.mask.shape
    assert torch.isfinite(out).all()
    assert (out[batch.mask == 0] == 0).all()
    advantages = grpo_advantages(batch.rewards, batch.group_ids,
                                 norm_by_std=name != "dr_grpo")
    # every method keeps the trajectory's sign on its tokens
    assert ((out * advantages[:, None]) >= 0).all()
    if not get_estimator(name).uses_reward:
        assert (out == 0).all()  # opsd: no credit, the distillation loss does the learning


@pytest.mark.parametrize("name", [n for n, e in ESTIMATORS.items() if e.row_local])
def test_row_local_estimators_read_no_other_rows_signals(name: str) -> None:
    """What ``row_local`` promises the trainer's per-micro-batch credit: a row's advantages do
    not change when the other rows' signals are replaced (here by zeros, as the trainer leaves
    the rows it has not reached yet), the rewards and groups staying as they are."""
    batch = synthetic_batch()
    want = get_estimator(name)(batch)
    for rows in ([0, 1, 2], [5], [3, 6, 7]):
        partial = synthetic_batch()
        others = [i for i in range(8) if i not in rows]
        for field in ("divergence", "entropy", "student_logprobs", "teacher_logprobs"):
            getattr(partial, field)[others] = 0.0
        got = get_estimator(name)(partial)
        torch.testing.assert_close(got[rows], want[rows], rtol=0, atol=0)
    # and the test can fail: top-entropy's batch-wide selection is not row-local
    partial = synthetic_batch()
    partial.entropy[1:] = 0.0
    assert not torch.equal(get_estimator("top_entropy")(partial)[0],
                           get_estimator("top_entropy")(synthetic_batch())[0])


@pytest.mark.parametrize("name", [n for n, e in ESTIMATORS.items() if e.outcome_scaled])
def test_outcome_scaled_estimators_give_zero_where_the_outcome_is_zero(name: str) -> None:
    """What ``outcome_scaled`` promises the trainer's teacher skip (signals.teacher_rows): a
    row with a zero outcome advantage gets 0 on every token, whatever its signals, and the
    other rows do not notice what those rows' signals were (zeros, as the trainer leaves
    them, or anything else)."""
    batch = synthetic_batch()
    batch.rewards[4:] = 1.0  # the second group is constant: outcome advantage 0
    estimator = get_estimator(name)
    want = estimator(batch)
    generator = torch.Generator().manual_seed(2)
    for fill in ("zeros", "random"):
        other = synthetic_batch()
        other.rewards[4:] = 1.0
        for field in ("divergence", "entropy", "student_logprobs", "teacher_logprobs"):
            values = getattr(other, field)
            values[4:] = (0.0 if fill == "zeros"
                          else torch.randn(values[4:].shape, generator=generator) * 5)
        got = estimator(other)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (want[4:] == 0).all() and (want[:4] != 0).any()


def test_declarations_say_what_each_estimator_is() -> None:
    gear_family = {"gear", "gear_token_kl", "gear_kl_only", "gear_entropy_only",
                   "gear_entropy_window", "gear_signed", "gear_steps"}
    assert {n for n, e in ESTIMATORS.items() if e.segments} == gear_family
    assert {n for n, e in ESTIMATORS.items() if e.needs_teacher} == (
        gear_family | {"rlsd", "opsd"})
    assert {n for n, e in ESTIMATORS.items() if not e.uses_reward} == {"opsd"}
    assert {n for n, e in ESTIMATORS.items() if e.self_distillation} == {"opsd"}
    assert get_estimator("top_entropy").needs == ("entropy",)
    # only top-entropy chooses tokens in the policy update (with selection=micro_batch)
    assert {n for n, e in ESTIMATORS.items() if e.update_mask is not None} == {"top_entropy"}
    assert {n for n, e in ESTIMATORS.items() if e.row_local} == (
        gear_family - {"gear_steps"}) | {"rlsd"}
    # the trainer may skip the teacher on zero-advantage rows of these (signals.teacher_rows)
    assert {n for n, e in ESTIMATORS.items() if e.outcome_scaled} == (
        gear_family - {"gear_steps"}) | {"rlsd"}
    for name, estimator in ESTIMATORS.items():
        assert estimator.description and estimator.paper, name
        assert estimator.fn.__module__.startswith("gear_rl.credit."), name


def test_every_estimator_is_documented() -> None:
    """docs/design.md's "how to add an estimator": one README table row per registered name,
    and design.md's list of the registered names names it (an estimator added without them is
    invisible to a reader)."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_0-9]+)` \|", readme, flags=re.MULTILINE))
    design = (root / "docs" / "design.md").read_text()
    listed = design[design.index("At the time of\nwriting they were"):]
    listed = listed[:listed.index("The registry is authoritative.")]
    named = set(re.findall(r"`([a-z_0-9]+)`", listed))
    ablations = {"gear_token_kl", "gear_kl_only", "gear_entropy_only", "gear_entropy_window"}
    assert set(ESTIMATORS) - rows == set(), "estimators without a README row"
    assert set(ESTIMATORS) - named - ablations == set(), "estimators design.md does not list"


def test_register_twice_raises_and_bad_declarations_raise() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("gear", config=GEARConfig)(lambda batch, config: batch.mask)
    with pytest.raises(ValueError, match="unknown needs"):
        register_estimator("x_bad_needs", config=GEARConfig, needs=("logits",))
    with pytest.raises(ValueError, match="fixed names field"):
        register_estimator("x_bad_fixed", config=OutcomeConfig, fixed={"alpha": 1.0})
    with pytest.raises(ValueError, match="outcome_scaled needs a config"):
        register_estimator("x_bad_scaled", config=dataclasses.make_dataclass("C", []),
                           outcome_scaled=True)
    with pytest.raises(ValueError, match=r"unknown estimator 'nope'.*plugins"):
        get_estimator("nope")
    assert not {"x_bad_needs", "x_bad_fixed", "x_bad_scaled"} & set(ESTIMATORS)


def test_plugin_module_registers_on_import(tmp_path, monkeypatch) -> None:
    module = tmp_path / "gear_rl_test_plugin_credit.py"
    module.write_text(
        "import torch\n"
        "from gear_rl.credit import OutcomeConfig, register_estimator, outcome_advantages\n"
        "@register_estimator('half_grpo_test', config=OutcomeConfig, paper='test',\n"
        "                    description='half of GRPO')\n"
        "def half(batch, config):\n"
        "    return 0.5 * outcome_advantages(batch, config)[:, None] * batch.mask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_plugins(["gear_rl_test_plugin_credit"]) == ["half_grpo_test"]
        batch = synthetic_batch()
        torch.testing.assert_close(get_estimator("half_grpo_test")(batch),
                                   0.5 * get_estimator("grpo")(batch))
    finally:  # leave the process-wide registry as the other tests expect it
        registry._REGISTRY.pop("half_grpo_test", None)
        sys.modules.pop("gear_rl_test_plugin_credit", None)
    with pytest.raises(ValueError, match="cannot import 'no_such_plugin_module'"):
        load_plugins(["no_such_plugin_module"])


def test_registry_matches_the_direct_calls() -> None:
    batch = synthetic_batch()
    advantages = grpo_advantages(batch.rewards, batch.group_ids)
    assert torch.equal(get_estimator("grpo")(batch), advantages[:, None] * batch.mask)
    for name, segmentation in [("gear", "kl_entropy"), ("gear_token_kl", "none"),
                               ("gear_kl_only", "kl_only"),
                               ("gear_entropy_only", "entropy_only"),
                               ("gear_entropy_window", "entropy_window")]:
        config = GEARConfig(segmentation=segmentation, alpha=0.8)
        direct = gear_advantages(advantages, batch.divergence, batch.entropy, batch.mask, config)
        estimator = get_estimator(name)
        assert torch.equal(estimator(batch, estimator.make_config(alpha=0.8)), direct)


def test_pinned_fields_cannot_be_contradicted() -> None:
    estimator = get_estimator("gear_kl_only")
    assert estimator.make_config().segmentation == "kl_only"
    with pytest.raises(ValueError, match="pins segmentation='kl_only'"):
        estimator.make_config(segmentation="none")
    with pytest.raises(ValueError, match="pins segmentation='kl_only'"):
        estimator(synthetic_batch(), GEARConfig())
    with pytest.raises(ValueError, match="has no config field"):
        get_estimator("grpo").make_config(alpha=1.0)
    with pytest.raises(ValueError, match="takes a GEARConfig"):
        get_estimator("gear")(synthetic_batch(), get_estimator("grpo").make_config())
    assert get_estimator("gear").make_config(segmentation="none").segmentation == "none"
    assert get_estimator("dr_grpo").make_config().norm_by_std is False
