"""``load_task("textarena:NAME")``: TextArena games as environment tasks the trainer runs.

The task's levels, seeds and planner references; its errors; the real episode loop driven by the
planner (every level solved in a shortest plan); and a tiny-model training run."""

from __future__ import annotations

import json
import math

import pytest

from gear_rl.agent.env_loop import run_env_episodes
from gear_rl.models import build_tiny_tokenizer, tiny_random_model
from gear_rl.signals import prompt_ids
from gear_rl.tasks import load_task
from gear_rl.train import Trainer, load_config

pytest.importorskip("textarena")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_textarena_task_levels_reset_and_step() -> None:
    task = load_task("textarena:FrozenLake-v0", options={"max_steps": 7}, train_size=3,
                     eval_size=2, seed=1)
    assert task.env is not None and task.agent is None and task.env.max_turns == 7
    seeds = [p.metadata["env_seed"] for p in (*task.train, *task.eval)]
    assert len(set(seeds)) == 5  # held-out levels use seeds of their own
    for problem in task.train:
        env = task.env.make()
        assert env.reset(problem.metadata["env_seed"]) == problem.prompt[0]["content"]
        moves = problem.answer.split(", ")
        assert len(moves) == problem.metadata["plan_length"] > 0
        assert problem.reference_kind == "solution" and problem.answer in problem.reference
        result = env.step(f"<action>{moves[0]}</action>")
        assert result.info["action"] == moves[0] and result.info["valid_action"]
        assert env.state_key != problem.prompt[0]["content"]
    assert load_task("textarena:FrozenLake-v0", train_size=3, eval_size=2,
                     seed=1).train[0].prompt == task.train[0].prompt


@pytest.mark.parametrize(("spec", "options", "match"), [
    ("textarena:Wordle-v0", None, r"FrozenLake-v0, FrozenLake-v0-random, .*Sokoban-v0"),
    ("textarena", None, "textarena:NAME"),
    ("textarena:FrozenLake-v0", {"game": "Sokoban-v0"}, "named in the task"),
    ("textarena:FrozenLake-v0", {"colour": 1}, "bad task_options"),
])
def test_textarena_task_errors(spec: str, options: dict | None, match: str) -> None:
    with pytest.raises(ValueError, match=match) as error:
        load_task(spec, options=options, train_size=2, eval_size=1)
    assert "\n" not in str(error.value)


class PlannerPolicy:
    """Answers every turn with the planner's next move."""

    def __init__(self, tokenizer, envs, stop_id: int) -> None:
        self.tokenizer, self.envs, self.stop_id = tokenizer, envs, stop_id

    def __call__(self, prompts, stop_strings, budgets):
        live = [env for env in self.envs if not env.done]
        assert len(live) == len(prompts)
        return [[*self.tokenizer.encode(f"<action>{env.plan()[0]}</action>",
                                        add_special_tokens=False), self.stop_id]
                for env in live]


@pytest.mark.parametrize("game", ["FrozenLake-v0-hardcore", "Sokoban-v0"])
def test_episode_loop_solves_textarena_levels_with_the_planner(game: str) -> None:
    tokenizer = build_tiny_tokenizer()
    task = load_task(f"textarena:{game}", options={"max_steps": 40}, train_size=2,
                     eval_size=1)
    envs = [task.env.make() for _ in task.train]
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    episodes = run_env_episodes(
        envs, [p.metadata["env_seed"] for p in task.train],
        [prompt_ids(tokenizer, p.prompt) for p in task.train], PlannerPolicy(tokenizer, envs, stop),
        tokenizer, stop_ids=[stop], max_turns=40, max_new_tokens_per_turn=32,
        max_response_tokens=100_000)
    for episode, problem in zip(episodes, task.train, strict=True):
        assert episode.success and episode.finish_reason == "solved"
        assert episode.actions == problem.answer.split(", ")
        assert len(set(episode.state_keys)) == len(episode.state_keys)  # a shortest plan
        assert episode.step_rewards[-1] == 1.0 and not any(episode.step_rewards[:-1])


@pytest.mark.parametrize("estimator", ["gigpo", "gear"])
def test_trainer_runs_a_textarena_task(tmp_path, estimator: str) -> None:
    config = load_config(None, [
        "model=tiny-random", "task=textarena:FrozenLake-v0", f"out={tmp_path / 'run'}",
        "steps=2", f"estimator={estimator}", "train_size=4", "eval.size=2", "eval.k=1",
        "eval.at_start=false", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
        "agent.max_turns=3", "agent.max_new_tokens_per_turn=4", "eval.max_new_tokens=4",
        "agent.max_response_tokens=600", "log.report_to=none", "log.progress=false",
        "loss.micro_batch_size=4", "optim.lr=1e-3",
    ])
    trainer = Trainer(config, model=tiny_random_model("llama", seed=1, initializer_range=0.2),
                      tokenizer=build_tiny_tokenizer())
    trainer.train()
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        for key in ("loss", "env/success_rate", "env/turns_per_episode", "adv_abs_mean"):
            assert math.isfinite(record[key]), key
        assert record["agent/observation_token_fraction"] > 0
    assert "eval/env/success_rate" in steps[-1]
