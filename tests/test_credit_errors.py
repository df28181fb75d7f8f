"""Bad input raises ValueError naming the argument; it never yields NaN."""

from __future__ import annotations

import pytest
import torch

from gear_rl.credit import (
    CreditBatch,
    GEARConfig,
    gear_advantages,
    gear_segments,
    get_estimator,
    grpo_advantages,
    rlsd_advantages,
    top_entropy_advantages,
)


def good() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ones(2), torch.rand(2, 5), torch.rand(2, 5), torch.ones(2, 5)


@pytest.mark.parametrize(("index", "bad", "match"), [
    (1, lambda x: x.index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(float("nan"))),
     "divergence contains NaN"),
    (2, lambda x: x.index_put_((torch.tensor([0]), torch.tensor([4])), torch.tensor(float("inf"))),
     "entropy contains NaN or inf"),
    (0, lambda x: x.index_put_((torch.tensor([0]),), torch.tensor(float("nan"))),
     "advantages contains NaN"),
    (3, lambda x: x.index_put_((torch.tensor([1]), torch.tensor([1])), torch.tensor(0.5)),
     "mask must contain only 0 and 1"),
    (3, lambda x: x * 2, "mask must contain only 0 and 1"),
    (1, lambda x: x[:, :4], r"divergence has shape \(2, 4\), expected \(2, 5\)"),
    (2, lambda x: x[0], r"entropy must have shape \[B, T\]"),
    (0, lambda x: torch.ones(3), "advantages has batch size 3, but mask has 2"),
    (0, lambda x: torch.ones(2, 1), r"advantages must have shape \[B\]"),
    (1, lambda x: (x * 10).long(), "divergence must be a floating-point tensor"),
    (2, lambda x: x.tolist(), "entropy must be a torch.Tensor"),
    (3, lambda x: x.reshape(10), r"mask must have shape \[B, T\]"),
])
def test_gear_rejects_bad_input(index: int, bad, match: str) -> None:
    args = list(good())
    args[index] = bad(args[index].clone())
    with pytest.raises(ValueError, match=match):
        gear_advantages(*args)


def test_gear_segments_rejects_nan_even_in_padding() -> None:
    _, div, ent, mask = good()
    mask[0, 4] = 0
    div[0, 4] = float("nan")
    with pytest.raises(ValueError, match="divergence contains NaN or inf"):
        gear_segments(div, ent, mask)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"normalize": "zscore"}, "normalize must be one of"),
    ({"segmentation": "turn"}, "segmentation must be one of"),
    ({"window": 0}, "window must be an integer >= 1"),
    ({"lambda_kl": float("nan")}, "lambda_kl must be a finite number"),
    ({"alpha": float("inf")}, "alpha must be a finite number"),
    ({"beta": "half"}, "beta must be a finite number"),
    ({"eps": -1.0}, "eps must be >= 0"),
])
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GEARConfig(**kwargs)


def test_gear_rejects_wrong_config_type() -> None:
    with pytest.raises(ValueError, match="config must be a GEARConfig"):
        gear_advantages(*good(), {"alpha": 1.0})


@pytest.mark.parametrize(("rewards", "groups", "match"), [
    (torch.tensor([1.0, float("nan")]), ["a", "a"], "rewards contains NaN"),
    (torch.tensor([[1.0, 0.0]]), ["a", "a"], r"rewards must have shape \[B\]"),
    (torch.tensor([1, 0]), ["a", "a"], "rewards must be a floating-point tensor"),
    (torch.tensor([1.0, 0.0]), ["a"], "group_ids has 1 entries, but the batch has 2"),
    (torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), "group_ids tensor must be integer"),
    (torch.tensor([1.0, 0.0]), "ab", "group_ids must be a sequence"),
    (torch.tensor([1.0, 0.0]), [["a"], ["b"]], "group_ids must be hashable"),
])
def test_grpo_rejects_bad_input(rewards: torch.Tensor, groups, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        grpo_advantages(rewards, groups)


def test_token_baselines_reject_bad_input() -> None:
    adv, div, ent, mask = good()
    with pytest.raises(ValueError, match="rho must be in"):
        top_entropy_advantages(adv, ent, mask, rho=0.0)
    with pytest.raises(ValueError, match="teacher_logprobs has shape"):
        rlsd_advantages(adv, div, div[:, :3], mask)
    bad = div.clone()
    bad[0, 0] = float("-inf")
    with pytest.raises(ValueError, match="student_logprobs contains NaN or inf"):
        rlsd_advantages(adv, bad, div, mask)


def test_registry_names_what_is_missing() -> None:
    batch = CreditBatch(rewards=torch.tensor([1.0, 0.0]), group_ids=[0, 0],
                        mask=torch.ones(2, 3))
    missing = r"needs CreditBatch field\(s\) \['divergence', 'entropy'\]"
    with pytest.raises(ValueError, match=missing):
        get_estimator("gear")(batch)
    with pytest.raises(ValueError, match="student_logprobs"):
        get_estimator("rlsd")(batch)
    with pytest.raises(ValueError, match="unknown estimator 'ppo'; registered:"):
        get_estimator("ppo")
    with pytest.raises(ValueError, match="rewards has batch size 3, but mask has 2"):
        get_estimator("grpo")(CreditBatch(torch.ones(3), [0, 0, 0], torch.ones(2, 3)))
