"""SPO-chain and VinePPO (``gear_rl.credit.mc``) against the authors' code.

The expected numbers were computed by the authors' own functions (SPO @ b9fc6a26:
``math_episode_generator_with_mc_advantages.py:392-439`` and ``ppo_trainer.py:820-827`` /
``utils.py:266-291``; VinePPO @ efe72284: ``gsm8k.py:65-142`` and
``math_episode_generator_with_mc_advantages.py:329-401``), run standalone on these inputs and
rounded to 6 digits; the values ``V`` are given, as the authors' code takes them from its
Monte-Carlo rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gear_rl.credit import CreditBatch, get_estimator
from gear_rl.credit.mc import (
    SPOChainConfig,
    VinePPOConfig,
    segment_advantages,
    spo_chain_boundaries,
    vineppo_boundaries,
    whiten,
)

CASES = json.loads((Path(__file__).parent / "data" / "mc_authors_cases.json").read_text())
_SPO = CASES["spo_chain"]
# three responses' log-probs of their sampled tokens (rows 2 and 3 end early), rewards, and
# V(prompt + response[:b]) for every b (index 0: the prompt)
LOGPROBS = _SPO["inputs"]["response_logprobs"]
LENGTHS = _SPO["inputs"]["lengths"]
REWARDS = _SPO["inputs"]["scores"]
VALUES = _SPO["inputs"]["state_values"]
# the authors' cut points (their c is the state after token c: b = c + 1 here) and per-token
# advantages after the probability zeroing, for cutpoint_interval 5, 2, 1
CUTS = {int(k): [[c + 1 for c in row["cutpoints"]] for row in rows]
        for k, rows in _SPO["by_interval"].items() if k in ("5", "2", "1")}
ADVANTAGES = {int(k): [row["advantages_generator"] for row in rows]
              for k, rows in _SPO["by_interval"].items() if k in ("5", "2", "1")}
# interval 5, whitened over the three rows' tokens below the threshold (the authors' micro-batch)
WHITENED_5 = [row["advantages_whitened_microbatch"] for row in _SPO["by_interval"]["5"]]
SELECTED_5 = [row["trainer_action_mask"] for row in _SPO["by_interval"]["5"]]
# GSM8K-style responses (the stop token decoded to ''), the values the authors' code was given
# (V at each estimated step start), reward, max_steps, and their token advantages
VINE_CASES = [
    (case["name"], ["" if t == "<eos>" else t for t in case["inputs"]["response_token_text"]],
     [case["inputs"]["mc_values_supplied_for_value_idx"][str(k)]
      for k in case["outputs"]["value_idx_estimated"]],
     case["inputs"]["score"], case["inputs"]["max_step_for_value_estimation"],
     case["outputs"]["token_advantages"])
    for case in CASES["vineppo"] if case["name"].startswith("gsm8k")]


def _spo_batch(cuts: list[list[int]]) -> CreditBatch:
    width = max(LENGTHS)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in LENGTHS])
    logprobs = torch.tensor(LOGPROBS) * mask
    return CreditBatch(rewards=torch.tensor(REWARDS), group_ids=[0, 0, 0], mask=mask,
                       student_logprobs=logprobs,
                       extras={"mc_values": [[VALUES[r][b] for b in row]
                                             for r, row in enumerate(cuts)]})


def _padded(rows: list[list[float]]) -> torch.Tensor:
    width = max(LENGTHS)
    return torch.tensor([row + [0.0] * (width - len(row)) for row in rows])


@pytest.mark.parametrize("interval", [5, 2, 1])
def test_spo_chain_cuts_and_advantages_match_the_authors(interval: int) -> None:
    config = SPOChainConfig(cut_interval=interval, whiten=False)
    for row, length in enumerate(LENGTHS):
        got = spo_chain_boundaries(LOGPROBS[row][:length], [1] * length, config)
        assert got == CUTS[interval][row]
    batch = _spo_batch(CUTS[interval])
    spo = get_estimator("spo_chain")
    assert spo.mc_boundaries is not None
    assert spo.mc_boundaries(batch, config) == CUTS[interval]
    torch.testing.assert_close(spo(batch, config), _padded(ADVANTAGES[interval]), atol=2e-6,
                               rtol=0)


def test_spo_chain_whitening_matches_the_authors_on_the_trained_tokens() -> None:
    batch = _spo_batch(CUTS[5])
    got = get_estimator("spo_chain")(batch, SPOChainConfig())
    selected = _padded([[float(m) for m in row] for row in SELECTED_5]).bool()
    torch.testing.assert_close(got[selected], _padded(WHITENED_5)[selected], atol=2e-5, rtol=0)
    assert bool((got[~selected] == 0).all())  # the probability mask: no credit, no statistics


def test_a_response_without_a_cut_gets_no_credit() -> None:
    """A response with no token below the threshold has no SPO-chain boundary: its tokens get 0,
    as the authors give them (their ``len(cutpoints) == 0`` branch), and the other rows keep
    their credit (this crashed a study cell: ``zip()`` of no boundaries against one end)."""
    assert segment_advantages(4, [], [], 1.0) == [0.0] * 4
    batch = _spo_batch(CUTS[5])
    batch.student_logprobs = batch.student_logprobs.clone()
    batch.student_logprobs[1] = 0.0  # every token of row 1 has probability 1: no cut
    config = SPOChainConfig(whiten=False)
    spo = get_estimator("spo_chain")
    assert spo.mc_boundaries is not None
    cuts = spo.mc_boundaries(batch, config)
    assert cuts[1] == [] and cuts[0] == CUTS[5][0]
    batch.extras = {"mc_values": [[VALUES[r][b] for b in row] for r, row in enumerate(cuts)]}
    got = spo(batch, config)
    assert bool((got[1] == 0).all())
    torch.testing.assert_close(got[0], _padded(ADVANTAGES[5])[0], atol=2e-6, rtol=0)
    whitened = spo(batch, SPOChainConfig())
    assert bool((whitened[1] == 0).all()) and bool(torch.isfinite(whitened).all())


@pytest.mark.parametrize("case", VINE_CASES, ids=[c[0] for c in VINE_CASES])
def test_vineppo_steps_and_advantages_match_the_authors(case) -> None:
    _, texts, values, reward, max_steps, expected = case
    config = VinePPOConfig(max_steps=max_steps, whiten=False)
    batch = CreditBatch(rewards=torch.tensor([reward]), group_ids=[0],
                        mask=torch.ones(1, len(texts)),
                        extras={"token_texts": [texts], "mc_values": [values]})
    vine = get_estimator("vineppo")
    assert vine.mc_boundaries is not None
    assert len(vine.mc_boundaries(batch, config)[0]) == len(values)
    torch.testing.assert_close(vine(batch, config)[0], torch.tensor(expected), atol=2e-6, rtol=0)


def test_whitening_matches_the_authors_over_a_micro_batch() -> None:
    """The authors whitened their four VinePPO cases' token advantages as one micro-batch (no
    probability mask): :func:`whiten` over the same rows gives their numbers."""
    rows = [case["outputs"]["token_advantages"] for case in CASES["vineppo"]]
    expected = [case["outputs"]["token_advantages_whitened_as_one_microbatch"]
                for case in CASES["vineppo"]]
    width = max(map(len, rows))
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in rows])
    got = whiten(torch.tensor([r + [0.0] * (width - len(r)) for r in rows]), mask.bool())
    want = torch.tensor([r + [0.0] * (width - len(r)) for r in expected])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_vineppo_step_split_rules() -> None:
    # leading blank lines stay in the first step; every later newline starts one; the answer
    # prefix joins the last step; an empty-text token belongs to the step it ends in
    assert vineppo_boundaries(["\n", "\n", "a", "\n", "b", "\n", "\n", "c", ""]) == [0, 3, 5, 6]
    assert vineppo_boundaries(["x", "\n", "y", "\n#### ", "5"]) == [0, 1]
    assert vineppo_boundaries(["x", "\n", "y", "\n#### ", "5"], answer_prefix=None) == [0, 1, 3]
    assert vineppo_boundaries(["no newline at all"]) == [0]


def test_bad_inputs_are_refused() -> None:
    for bad in ({"mc_samples": 0}, {"prob_threshold": 0.0}, {"prob_threshold": 1.5},
                {"cut_interval": 0}, {"cut_interval": True}, {"mc_samples": 10**22},
                {"whiten": "ture"}, {"prob_mask": 1}, {"dedupe_prefixes": None}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SPOChainConfig(**bad)  # type: ignore[arg-type]
    for bad in ({"mc_samples": 1.5}, {"max_steps": 0}, {"max_steps": 10**22},
                {"answer_prefix": 3}, {"dedupe_prefixes": "no"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            VinePPOConfig(**bad)  # type: ignore[arg-type]
    batch = _spo_batch(CUTS[5])
    batch.extras = {}
    with pytest.raises(ValueError, match="mc_values"):
        get_estimator("spo_chain")(batch, SPOChainConfig())
    batch.extras = {"mc_values": [[0.5], [0.5], [0.5]]}
    with pytest.raises(ValueError, match="row 0"):
        get_estimator("spo_chain")(batch, SPOChainConfig())
