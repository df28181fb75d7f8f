"""The ``gear`` trainer mode's Monte-Carlo values phase (SPO-chain, VinePPO in verl;
``gear_rl.integrations.verl.values``): which prefixes are continued, how the values are averaged,
and, in a real verl job on this CPU (``.venv/verl-cpu``; slow), that the values are the
policy's: within 4 standard errors of the exact value, enumerated over every continuation of a
two-token budget with the job's initial weights, and the advantages verl trained on exactly the
registry's given those values."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

pytest.importorskip("verl")

from gear_rl.integrations.verl.values import (
    call_reward,
    continuation_requests,
    estimate_values,
    job_scorer,
)


def test_identical_prefixes_are_continued_once_and_budgets_count_down() -> None:
    prompts = [[1, 2], [1, 2], [3]]
    responses = [[5, 6, 7], [5, 6, 9], [5, 6, 7]]
    requests = continuation_requests(prompts, responses, [[0, 2], [2, 3], [2]], 4)
    by_prefix = {r.prefix: r for r in requests}
    # rows 0 and 1 share the prompt and the first two response tokens; row 2 has its own prompt
    assert by_prefix[(1, 2, 5, 6)].rows == ((0, 1), (1, 0))
    assert by_prefix[(1, 2)].budget == 4 and by_prefix[(1, 2, 5, 6, 9)].budget == 1
    assert by_prefix[(3, 5, 6)].rows == ((2, 0),)
    assert len(requests) == 4
    assert len(continuation_requests(prompts, responses, [[0, 2], [2, 3], [2]], 4,
                                     dedupe=False)) == 5
    with pytest.raises(ValueError, match="boundary 4 outside"):
        continuation_requests([[1]], [[2, 3]], [[4]], 8)


def test_values_are_the_mean_reward_of_each_prefixs_continuations() -> None:
    calls = []

    async def generate(prefix, max_tokens):
        calls.append((tuple(prefix), max_tokens))
        return [len(calls) % 2] * max_tokens  # alternately zeros and ones

    def score(row, ids):  # the share of ones in the response
        return sum(ids) / len(ids) if ids else 0.0

    result = estimate_values([[9], [9]], [[1, 0], [1, 1]], [[0, 1], [1, 2]], samples=4,
                             max_response_length=2, generate=generate, score=score)
    # prefix [9]: continuations [1,1] / [0,0] alternately -> 0.5; prefix [9, 1]: [1]+[1] or
    # [1]+[0] -> 0.75; prefix [9, 1, 1] (budget 0): its own reward 1.0
    assert result.values == [[0.5, 0.75], [0.75, 1.0]]
    assert len(result.requests) == 3 and result.tokens == 4 * 2 + 4 * 1
    assert all(max_tokens > 0 for _, max_tokens in calls)  # a spent budget asks nothing
    with pytest.raises(ValueError, match="mc_samples"):
        estimate_values([[9]], [[1]], [[0]], samples=0, max_response_length=2,
                        generate=generate, score=score)


def test_the_reward_function_is_called_as_verls_reward_manager_calls_it() -> None:
    seen = {}

    def fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        seen.update(data_source=data_source, solution=solution_str, gt=ground_truth)
        return {"score": 0.25, "acc": True}

    async def afn(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5

    assert call_reward(fn, "src", "text", "7", {"i": 1}) == 0.25
    assert seen == {"data_source": "src", "solution": "text", "gt": "7"}
    assert call_reward(afn, "src", "text", "7", None) == 0.5


def test_a_reward_function_that_raises_ends_the_values_phase_naming_the_setting() -> None:
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("no such answer")

    score = job_scorer(broken, lambda ids: " ".join(map(str, ids)), ["gear_rl/math"],
                       [{"ground_truth": "7"}], [{}], "algorithm.adv_estimator=vineppo")
    with pytest.raises(RuntimeError, match=r"adv_estimator=vineppo: the job's reward function "
                       r".*row 0 \(data_source 'gear_rl/math'\): KeyError"):
        estimate_values([[1]], [[2, 3]], [[1]], samples=2, max_response_length=4,
                        generate=_constant_generate, score=score)
    good = job_scorer(lambda data_source, solution_str, ground_truth, extra_info: float(
        solution_str == ground_truth), lambda ids: "".join(map(str, ids)), ["s"],
        [{"ground_truth": "35"}], [None], "x")
    assert good(0, [3, 5]) == 1.0 and good(0, [3]) == 0.0


async def _constant_generate(prefix, max_tokens):
    return [5] * max_tokens


# ------------------------------------------------------------------ a real job
def _exact_value(model, tokenizer, prefix, response_prefix, budget, eos, reward):
    """``E[reward(response_prefix + continuation)]`` over every continuation of at most
    ``budget`` (1 or 2) tokens sampled at temperature 1, stopping at ``eos``; and its variance."""
    with torch.no_grad():
        first = torch.softmax(model(input_ids=torch.tensor([prefix])).logits[0, -1].float(), -1)
        vocab = first.shape[0]
        outcomes: list[tuple[float, list[int]]] = []
        if budget == 1:
            outcomes = [(float(first[t]), [t]) for t in range(vocab)]
        else:
            ids = torch.tensor([[*prefix, t] for t in range(vocab)])
            second = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1)
            for t1 in range(vocab):
                if t1 == eos:
                    outcomes.append((float(first[t1]), [t1]))
                    continue
                outcomes.extend((float(first[t1] * second[t1, t2]), [t1, t2])
                                for t2 in range(vocab))
    texts = tokenizer.batch_decode([response_prefix + c for _, c in outcomes],
                                   skip_special_tokens=True)
    values = [reward(None, text, None) for text in texts]
    mean = sum(p * v for (p, _), v in zip(outcomes, values, strict=True))
    second_moment = sum(p * v * v for (p, _), v in zip(outcomes, values, strict=True))
    return mean, max(0.0, second_moment - mean * mean)


@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("vllm", "transfer_queue", "hydra", "ray")),
                    reason="a real job runs in .venv/verl-cpu (scripts/setup_verl_cpu.sh)")
def test_vineppo_in_verl_values_are_the_policys_and_its_advantages_the_registrys(
        tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gear_rl.credit import CreditBatch, get_estimator
    from gear_rl.integrations.verl.rewards import digit_share_reward
    from test_verl_cpu_job import _check_run, _job

    samples = 8
    rc, log, run = _job(tmp_path, "vineppo", [
        "algorithm.adv_estimator=vineppo", "trainer.v1.trainer_mode=gear",
        f"++algorithm.gear.mc_samples={samples}", "data.max_response_length=2",
        f"++algorithm.gear.dump_dir={tmp_path}/run-vineppo/dump"])
    metrics = _check_run(rc, log)
    for values in metrics.values():
        assert values["gear/mc_prefixes"] >= 1 and values["gear/mc_continuation_tokens"] > 0
        assert values["timing_s/gear_values"] > 0
    estimator = get_estimator("vineppo")
    for step in (1, 2):  # the advantages verl trained on, given the dumped values
        record = torch.load(run / "dump" / f"step-{step:04d}.pt")
        mask = record["response_mask"]
        batch = CreditBatch(rewards=record["token_level_scores"].sum(-1), mask=mask,
                            group_ids=record["uid"], student_logprobs=record["student_logprobs"],
                            extras={"token_texts": record["token_texts"],
                                    "mc_values": record["mc_values"]})
        expected = estimator(batch, estimator.make_config(mc_samples=samples)).float()
        torch.testing.assert_close(record["advantages"] * mask, expected * mask, rtol=0, atol=0)
    # step 1's values against the exact values of the initial weights (the model on disk)
    record = torch.load(run / "dump" / "step-0001.pt")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny-qwen2").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny-qwen2")
    eos = int(model.generation_config.eos_token_id)
    checked = 0
    for request, rewards in zip(record["mc_requests"], record["mc_rewards"], strict=True):
        assert len(rewards) == samples
        if request["budget"] == 0:
            continue
        exact, variance = _exact_value(model, tokenizer, request["prefix"],
                                       request["response_prefix"], request["budget"], eos,
                                       digit_share_reward)
        estimate = sum(rewards) / samples
        se = math.sqrt(variance / samples)
        assert abs(estimate - exact) <= 4 * se + 1e-9, (request, estimate, exact, se)
        for row, k in request["rows"]:
            assert record["mc_values"][row][k] == pytest.approx(estimate)
        checked += 1
    assert checked >= 1
