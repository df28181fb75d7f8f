"""The trainer as an agent trainer: multi-turn environment episodes and tool-using tasks.

Tiny-model training runs of every step-level estimator on both built-in environments, the
observation mask carried from the rollout into signals, credit and loss, the episode loop
driven by the BFS planner, the chat-form observation tokens against the chat template, and
the task / estimator pairing errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_trainer
from gear_rl.agent.env_loop import chat_observation_ids, run_env_episodes
from gear_rl.credit import estimator_names
from gear_rl.models import build_tiny_tokenizer
from gear_rl.signals import prompt_ids
from gear_rl.tasks import load_task
from gear_rl.train import Trainer, load_config

pytestmark = pytest.mark.usefixtures("one_thread")


def make_trainer(tmp_path, task: str, *overrides: str, task_obj=None) -> Trainer:
    return tiny_trainer(tmp_path / "run", f"task={task}", "train_size=6", "eval.size=2",
                        "rollout.samples_per_prompt=2", "agent.max_turns=3",
                        "agent.max_new_tokens_per_turn=4", "eval.max_new_tokens=4",
                        "agent.max_response_tokens=300", *overrides,
                        task=task_obj if task_obj is not None else "config")


def records(trainer: Trainer, name: str) -> list[dict]:
    return [json.loads(line) for line in (trainer.run_dir / name).read_text().splitlines()]


@pytest.mark.parametrize("env", ["sokoban", "keydoor"])
@pytest.mark.parametrize("estimator", estimator_names(step_level=True))
def test_step_estimators_train_on_environments(tmp_path, env: str, estimator: str) -> None:
    trainer = make_trainer(tmp_path, env, f"estimator={estimator}")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    changed = any(not torch.equal(a, b) for a, b in
                  zip(trainer.model.parameters(), before, strict=True))
    steps = [r for r in records(trainer, "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        for key in ("loss", "env/success_rate", "agent/observation_token_fraction",
                    "env/turns_per_episode", "adv_abs_mean"):
            assert math.isfinite(record[key]), key
        assert record["agent/observation_token_fraction"] > 0
    assert "eval/env/success_rate" in steps[-1]
    if estimator == "turn_level":
        # The random byte-level model never writes a parsable move: every turn of every
        # episode earns the same reward and no episode succeeds, so MT-GRPO's group-normalised
        # turn and outcome terms are exactly zero, and so is the update.
        assert all(r["adv_abs_mean"] == 0 and r["env/parsed_action_rate"] == 0 for r in steps)
        assert not changed
    else:
        # The others discount the per-turn penalties: episodes cut after different numbers of
        # turns (token budget) give different returns in the same state, hence credit.
        assert any(r["adv_abs_mean"] > 0 for r in steps)
        assert changed, "no parameter changed"
    assert trainer.sandbox is None


def test_observation_tokens_get_no_signal_credit_or_loss(tmp_path) -> None:
    trainer = make_trainer(tmp_path, "sokoban", "estimator=gear", "steps=1")
    _, output = trainer.step(1)
    batch, scores = output.batch, output.scores
    assert batch.policy_masks is not None
    for row, policy in enumerate(batch.policy_masks):
        n = len(policy)
        mask = scores.mask[row, :n]
        assert mask.tolist() == [float(v) for v in policy]
        observation = mask == 0
        assert bool(observation.any()), "expected an observation in a multi-turn episode"
        values = {"advantages": output.advantages, "divergence": scores.divergence,
                  "entropy": scores.entropy, "old_logprobs": scores.old_logprobs}
        for name, tensor in values.items():
            assert torch.all(tensor[row, :n][observation] == 0), name
        assert torch.all(scores.mask[row, n:] == 0)
    sample = trainer.samples(output, 1)[0]
    assert len(sample["turn_ids"]) == len(sample["mask"]) == len(sample["tokens"])
    assert "<|im_start|>user" in sample["transcript"]
    trainer.close()


def test_step_estimators_need_multi_turn_tasks(tmp_path) -> None:
    with pytest.raises(ValueError, match="multi-turn task"):
        make_trainer(tmp_path, "products", "estimator=gigpo")
    with pytest.raises(ValueError, match="turn_level"):
        make_trainer(tmp_path, "tool-math", "estimator=gagpo")


def test_turn_level_warns_on_an_agent_task_without_turn_rewards(tmp_path) -> None:
    import warnings

    with pytest.warns(UserWarning, match="pays no turn rewards"):
        make_trainer(tmp_path / "a", "bfcl:simple", "estimator=turn_level").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        make_trainer(tmp_path / "b", "tool-math", "estimator=turn_level").close()


def test_unknown_step_estimator_config_is_an_error() -> None:
    with pytest.raises(ValueError, match="omega_typo"):
        load_config(None, ["estimator=gigpo", "credit.omega_typo=1"]).validate()


def test_function_calling_task_runs_one_turn_episodes(tmp_path) -> None:
    trainer = make_trainer(tmp_path, "bfcl:simple", "steps=1", "estimator=gear",
                           "rollout.max_new_tokens=8")
    assert trainer.sandbox is None  # calls are scored against the gold call, not run
    trainer.train()
    step = next(r for r in records(trainer, "metrics.jsonl") if "reward_mean" in r)
    for key in ("agent/tool_call_rate", "agent/observation_token_fraction",
                "agent/finish_length"):
        assert key in step
    assert step["agent/observation_token_fraction"] == 0.0


def test_tool_math_trainer_owns_and_closes_a_sandbox(tmp_path) -> None:
    trainer = make_trainer(tmp_path, "tool-math", "steps=1", "estimator=turn_level",
                           "agent.sandbox_workers=1")
    sandbox = trainer.sandbox
    assert sandbox is not None and sandbox.run("print(6 * 7)").stdout.strip() == "42"
    trainer.train()
    assert trainer.sandbox is None
    step = next(r for r in records(trainer, "metrics.jsonl") if "reward_mean" in r)
    assert "agent/tool_call_rate" in step and math.isfinite(step["loss"])
    assert 0 <= step["agent/turn_reward_mean"] <= 0.7  # MT-GRPO's turn rewards, at most 0.2+0.5


def test_chat_observation_tokens_match_the_chat_template() -> None:
    tokenizer = build_tiny_tokenizer()
    user, reply, board = "start board", "<action>up</action>", "next board"
    prompt = prompt_ids(tokenizer, [{"role": "user", "content": user}])
    reply_ids = tokenizer.encode(reply, add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    closed = prompt + reply_ids + [eos] + chat_observation_ids(tokenizer, board,
                                                               turn_closed=True)
    open_turn = prompt + reply_ids + chat_observation_ids(tokenizer, board, turn_closed=False)
    expected = prompt_ids(tokenizer, [{"role": "user", "content": user},
                                      {"role": "assistant", "content": reply},
                                      {"role": "user", "content": board}])
    assert closed == expected
    assert open_turn == expected


class PlannerPolicy:
    """A scripted policy: answers every turn with the planner's next move (the tests' scripted
    planner drives the real episode loop and environment)."""

    def __init__(self, tokenizer, envs, stop_id: int) -> None:
        self.tokenizer, self.envs, self.stop_id = tokenizer, envs, stop_id
        self.calls = 0

    def __call__(self, prompts, stop_strings, budgets):
        rows = []
        live = [env for env in self.envs if not env.done]
        assert len(live) == len(prompts)
        for env in live:
            move = env.plan()[0]
            action = self.tokenizer.encode(f"<action>{move}</action>", add_special_tokens=False)
            rows.append([*action, self.stop_id])
        self.calls += 1
        return rows


@pytest.mark.parametrize("env_name", ["sokoban", "keydoor"])
def test_episode_loop_solves_levels_with_the_planner(env_name: str) -> None:
    tokenizer = build_tiny_tokenizer()
    task = load_task(env_name, train_size=3, eval_size=1)
    envs = [task.env.make() for _ in task.train]
    seeds = [p.metadata["env_seed"] for p in task.train]
    prompts = [prompt_ids(tokenizer, p.prompt) for p in task.train]
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    policy = PlannerPolicy(tokenizer, envs, stop)
    episodes = run_env_episodes(envs, seeds, prompts, policy, tokenizer, stop_ids=[stop],
                                max_turns=40, max_new_tokens_per_turn=32,
                                max_response_tokens=100_000)
    for episode, problem in zip(episodes, task.train, strict=True):
        assert episode.success and episode.finish_reason == "solved"
        assert len(episode.step_spans) == problem.metadata["plan_length"]
        assert episode.actions == problem.answer.split(", ")
        assert len(set(episode.state_keys)) == len(episode.state_keys)  # a shortest plan
        assert len(episode.observation_spans) == len(episode.step_spans) - 1
        for start, end in episode.step_spans:
            assert all(episode.loss_mask[start:end])
            assert episode.response_ids[end - 1] == stop
        for start, end in episode.observation_spans:
            assert not any(episode.loss_mask[start:end])
        assert episode.step_rewards[-1] > 0  # the solving move


def test_episode_loop_stops_at_the_token_budget_and_turn_limit() -> None:
    tokenizer = build_tiny_tokenizer()
    task = load_task("keydoor", train_size=2, eval_size=1)
    envs = [task.env.make() for _ in task.train]
    seeds = [p.metadata["env_seed"] for p in task.train]
    prompts = [prompt_ids(tokenizer, p.prompt) for p in task.train]
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def idle(prompts, stop_strings, budgets):
        return [[*tokenizer.encode("hmm", add_special_tokens=False), stop] for _ in prompts]

    episodes = run_env_episodes(envs, seeds, prompts, idle, tokenizer, stop_ids=[stop],
                                max_turns=2, max_new_tokens_per_turn=8,
                                max_response_tokens=100_000)
    assert [e.finish_reason for e in episodes] == ["max_turns", "max_turns"]
    assert all(e.actions == [None, None] and not e.success for e in episodes)
    episodes = run_env_episodes(envs, seeds, prompts, idle, tokenizer, stop_ids=[stop],
                                max_turns=5, max_new_tokens_per_turn=8, max_response_tokens=20)
    assert [e.finish_reason for e in episodes] == ["token_budget", "token_budget"]
    assert all(len(e.response_ids) < 20 for e in episodes)
    with pytest.raises(ValueError, match="differ in length"):
        run_env_episodes(envs, seeds[:1], prompts, idle, tokenizer, stop_ids=[stop],
                         max_turns=1, max_new_tokens_per_turn=1, max_response_tokens=1)


@pytest.mark.parametrize(("spec", "kwargs", "match"), [
    ("toolrl", {}, "toolrl:PATH"),
    ("bfcl", {"options": {"x": 1}}, "task_options"),
    ("sokoban:big", {}, "no ':' argument"),
    ("sokoban", {"options": {"num_boxes": 9}}, "num_boxes"),
    ("sokoban", {"options": {"colour": 1}}, "bad task_options"),
    ("keydoor", {"eval_path": "x.jsonl"}, "eval_data"),  # the user's key
    ("tool-math", {"instruction": ""}, None),
])
def test_load_task_agent_specs(spec: str, kwargs: dict, match: str | None) -> None:
    if match is None:
        task = load_task(spec, train_size=2, eval_size=1, **kwargs)
        assert task.agent is not None and task.agent.tool == "python"
        assert task.train[0].prompt[0]["role"] == "system"
        return
    with pytest.raises(ValueError, match=match):
        load_task(spec, train_size=2, eval_size=1, **kwargs)


def test_multi_turn_updates_checkpoint_layers_by_default_with_the_same_result(tmp_path) -> None:
    """``loss.checkpoint_layers=None`` turns layer checkpointing on for agent and environment
    tasks and leaves it off for single-turn ones; an explicit value wins; a GEAR step on
    multi-turn rows gives the same loss and the same weights with it as without it."""
    assert not tiny_trainer(tmp_path / "single", "steps=1").engine.signals.checkpoint_layers
    outcomes = {}
    for value in ("null", "false"):
        trainer = make_trainer(tmp_path / value, "sokoban", "estimator=gear", "steps=1",
                               f"loss.checkpoint_layers={value}")
        assert trainer.engine.signals.checkpoint_layers == (value == "null")
        record, _ = trainer.step(1)
        outcomes[value] = (record["loss"], [p.detach().clone() for p in trainer.model.parameters()])
        trainer.close()
    assert outcomes["null"][0] == pytest.approx(outcomes["false"][0], rel=1e-6, abs=1e-9)
    for got, want in zip(outcomes["null"][1], outcomes["false"][1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-6)


def test_multi_turn_evaluation_decodes_a_rollouts_rows_at_a_time(tmp_path) -> None:
    """An agent task's evaluation decodes at most rollout.prompts_per_step x
    rollout.samples_per_prompt rows at once (its KV caches span whole episodes), whatever
    eval.batch_size allows; the sampler's forwards are watched, not replaced."""
    trainer = make_trainer(tmp_path, "tool-math", "steps=1", "eval.size=4", "eval.k=3",
                           "eval.batch_size=64", "rollout.prompts_per_step=2",
                           "agent.sandbox_workers=1")
    widths: list[int] = []
    trainer.sampler.register_forward_pre_hook(
        lambda _module, args, kwargs: widths.append(
            (kwargs.get("input_ids") if kwargs.get("input_ids") is not None
             else args[0]).shape[0]), with_kwargs=True)
    result = trainer.evaluate()
    trainer.close()
    assert result["samples"] == 12
    assert widths and max(widths) == 4  # 2 prompts x 2 samples per step, not 12


@pytest.mark.parametrize("env", ["sokoban", "keydoor"])
def test_turn_kv_reuse_trains_and_evaluates_as_prefilling_every_turn(tmp_path, env: str) -> None:
    """``agent.reuse_kv_cache`` changes how much each turn prefills, not what is sampled: in
    fp32 a GEAR step and an evaluation give the same episodes, loss and scores with it as
    without it, and the sampler prefills fewer tokens with it (counted by a hook on the
    sampler's forwards, not replaced)."""
    outcomes = {}
    for reuse in ("true", "false"):
        trainer = make_trainer(tmp_path / reuse, env, "estimator=gear", "steps=1",
                               "rollout.dtype=fp32", "eval.at_start=true",
                               f"agent.reuse_kv_cache={reuse}")
        prefilled = [0]

        def count(_module, args, kwargs, prefilled=prefilled) -> None:
            ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
            if ids.shape[1] > 1:
                prefilled[0] += ids.numel()

        trainer.sampler.register_forward_pre_hook(count, with_kwargs=True)
        trainer.train()
        trainer.close()
        metrics = [r for r in records(trainer, "metrics.jsonl") if "step" in r]
        samples = [(s["prompt"], s["response"]) for s in records(trainer, "samples.jsonl")]
        outcomes[reuse] = (metrics, samples, prefilled[0])
    (metrics_on, samples_on, prefill_on), (metrics_off, samples_off, prefill_off) = (
        outcomes["true"], outcomes["false"])
    assert samples_on == samples_off
    assert len(metrics_on) == len(metrics_off)
    for on, off in zip(metrics_on, metrics_off, strict=True):
        for key in ("loss", "reward_mean", "env/turns_per_episode", "eval/env/success_rate",
                    "eval/mean@1", "eval/env/step_reward_mean", "eval/response_len"):
            if key in off:
                assert on[key] == pytest.approx(off[key], rel=1e-6, abs=1e-9), key
    assert 0 < prefill_on < prefill_off
