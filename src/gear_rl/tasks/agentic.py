"""Agent tasks for the trainer: tool-integrated math (a Python tool) and multi-turn environments.

GEAR (arXiv 2605.11853) is evaluated on tool-integrated math and agentic function calling, and
its step-level rivals (GiGPO arXiv 2505.10978, GAGPO arXiv 2605.13217, Gated-BEPO) on text
Sokoban. These builders turn those settings into :class:`~gear_rl.tasks.Task` objects whose
``agent`` / ``env`` field tells the trainer how to roll them out:

- :func:`tool_math_task`: a reasoning-gym problem with a system prompt that offers a Python tool;
  the policy's code runs in the sandbox and its output comes back as observation tokens. The
  teacher is conditioned on the reference answer.
- :func:`env_task`: one level per problem (``metadata["env_seed"]``) of a text game: built-in
  (``sokoban``, ``keydoor``) or a TextArena grid game (``textarena:GAME``, see
  :mod:`gear_rl.envs.textarena`); the first board is the prompt; the teacher is conditioned on
  the BFS planner's shortest move sequence (the ground truth a teacher can be shown).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from gear_rl.tasks.base import (
    DEFAULT_EVAL_SIZE,
    DEFAULT_TRAIN_SIZE,
    AgentSpec,
    EnvSpec,
    Problem,
    Task,
)

__all__ = ["ENV_NAMES", "MT_GRPO_TURN_REWARDS", "TOOL_MATH_PRESET", "env_factory", "env_task",
           "tool_math_task"]

TOOL_MATH_PRESET: tuple[str, dict[str, Any]] = (
    "products", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2})
"""The default tool-math problems: products of two 2-digit numbers (hard to do in one's head
for a 135M model, one line of Python)."""

MT_GRPO_TURN_REWARDS: tuple[float, float] = (0.2, 0.5)
"""Tool math's turn rewards ``(tool, answer)``, after MT-GRPO's verifiable turn rewards
(arXiv 2505.11821; the authors' TriviaQA rubric pays 0.2 times the share of tool calls that
executed and 0.5 when the search result holds the answer). Here the tool is Python and "holds
the answer" means the task's scorer accepts the turn's output as the answer."""


def tool_math_task(
    name: str | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    tool_format: str = "markdown",
    max_turns: int = 3,
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    instruction: str = "",
    turn_rewards: tuple[float, float] = MT_GRPO_TURN_REWARDS,
) -> Task:
    """Reasoning-gym math with a Python tool.

    Args:
        name: a reasoning-gym preset or dataset (None: :data:`TOOL_MATH_PRESET`).
        options: dataset config overrides.
        tool_format: ``"markdown"`` (default: SmolLM2-135M-Instruct writes ```` ```python ````
            fences on its own; it almost never writes ``<python>`` tags), ``"python"`` or
            ``"json"``.
        max_turns: policy turns (tool calls are made in all but the last).
        train_size, eval_size, seed, instruction: as in
            :func:`~gear_rl.tasks.reasoning_gym_task`.
        turn_rewards: ``(tool, answer)``, the turn rewards of ``turn_level``
            (:class:`~gear_rl.tasks.base.AgentSpec`'s ``turn_reward_tool`` and
            ``turn_reward_answer``): a turn whose code ran, and one whose output is the answer.
            The default is MT-GRPO's rubric (:data:`MT_GRPO_TURN_REWARDS`).
    """
    from gear_rl.agent.parsing import MARKDOWN_TOOL_INSTRUCTIONS, PYTHON_TOOL_INSTRUCTIONS
    from gear_rl.tasks.reasoning_gym_task import reasoning_gym_task

    system = {"markdown": MARKDOWN_TOOL_INSTRUCTIONS, "python": PYTHON_TOOL_INSTRUCTIONS}.get(
        tool_format)
    if system is None:
        raise ValueError(f"tool_format must be 'markdown' or 'python', got {tool_format!r}")
    if name is None:
        name, options = TOOL_MATH_PRESET[0], {**TOOL_MATH_PRESET[1], **(options or {})}
    base = reasoning_gym_task(name, options=options, train_size=train_size, eval_size=eval_size,
                              seed=seed, instruction=instruction)

    def with_tool(problem: Problem) -> Problem:
        prompt = [{"role": "system", "content": system}, *problem.prompt]
        return Problem(id=problem.id, prompt=prompt, answer=problem.answer,
                       reference=problem.reference, reference_kind=problem.reference_kind,
                       data_source=problem.data_source, metadata=problem.metadata)

    return Task(name=f"tool-math {base.name}", train=[with_tool(p) for p in base.train],
                eval=[with_tool(p) for p in base.eval], scorer=base.scorer, extract=base.extract,
                agent=AgentSpec(tool="python", tool_format=tool_format, max_turns=max_turns,
                                score_text="final", turn_reward_tool=turn_rewards[0],
                                turn_reward_answer=turn_rewards[1]))


def env_factory(name: str, options: Mapping[str, Any]) -> Callable[[], Any]:
    """A constructor of environment ``name`` (``sokoban``, ``keydoor``, ``textarena:GAME``) with
    config ``options``; an unknown name or a bad option raises a ``ValueError`` naming it."""
    from gear_rl.envs import (
        TEXTARENA_GAMES,
        KeyDoorConfig,
        KeyDoorEnv,
        SokobanConfig,
        SokobanEnv,
        TextArenaConfig,
        TextArenaEnv,
    )

    kind, _, game = name.partition(":")
    kinds = {"sokoban": (SokobanEnv, SokobanConfig), "keydoor": (KeyDoorEnv, KeyDoorConfig),
             "textarena": (TextArenaEnv, TextArenaConfig)}
    if kind not in kinds:
        raise ValueError(f"unknown environment {name!r}; choose from {sorted(kinds)}")
    if kind == "textarena":
        if not game:
            raise ValueError("task textarena needs a game, textarena:NAME; NAME one of "
                             + ", ".join(TEXTARENA_GAMES))
        if "game" in options:
            raise ValueError("the TextArena game is named in the task (textarena:NAME), "
                             "not in task_options")
        options = {**options, "game": game}
    elif game:
        raise ValueError(f"task {kind!r} takes no ':' argument; use task_options")
    env_cls, config_cls = kinds[kind]
    try:
        config = config_cls(**options)
    except TypeError as error:
        raise ValueError(f"bad task_options for {name}: {error}") from error
    return lambda: env_cls(config)


ENV_NAMES = ("sokoban", "keydoor", "textarena")
"""Environment task kinds; ``textarena`` takes its game after a colon."""


def env_task(
    name: str,
    *,
    options: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
) -> Task:
    """A text game as a multi-turn task: problem ``i`` is the level of one seed.

    Args:
        name: ``"sokoban"``, ``"keydoor"`` or ``"textarena:GAME"`` (a game of
            :data:`gear_rl.envs.textarena.TEXTARENA_GAMES`).
        options: the environment's config fields (e.g. ``num_boxes``, ``max_steps``).
        max_turns: policy turns per episode (None: the environment's ``max_steps``).
        train_size, eval_size: levels per split; the held-out levels use disjoint seeds.
        seed: level seed base.
    """
    if train_size < 1 or eval_size < 1:
        raise ValueError(f"train_size and eval_size must be >= 1, got {train_size}, {eval_size}")
    make = env_factory(name, dict(options or {}))
    probe = make()
    turns = max_turns if max_turns is not None else int(probe.config.max_steps)
    if turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {turns}")
    base = random.Random(seed).randrange(1 << 30)

    def level(split: str, index: int, env_seed: int) -> Problem:
        env = make()
        first = env.reset(env_seed)
        plan = env.plan() or []
        moves = ", ".join(plan)
        return Problem(
            id=f"{name}/{split}/{index}", prompt=[{"role": "user", "content": first}],
            answer=moves,
            reference=f"The moves of a shortest solution, one per turn: {moves}.",
            reference_kind="solution", data_source=f"env/{name}",
            metadata={"env_seed": env_seed, "plan_length": len(plan)})

    train = [level("train", i, base + i) for i in range(train_size)]
    held_out = [level("eval", i, base + (1 << 30) + i) for i in range(eval_size)]

    def not_scored(problem: Problem, response: str) -> float:
        raise RuntimeError(f"{name} episodes are scored by the environment, not from text")

    return Task(name=f"env:{name} {dict(options or {})}", train=train, eval=held_out,
                scorer=not_scored, extract=lambda text: None,
                env=EnvSpec(make=make, max_turns=turns))
