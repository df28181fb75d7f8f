"""A :class:`~gear_rl.envs.base.TextEnv` over any :class:`~gear_rl.envs.base.GridModel`: the
turn loop, action parsing, the malformed-action rule and the step limit, shared by the built-in
games."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from gear_rl.envs.base import DIRECTIONS, GridModel, StepResult, TextEnv, bfs_plan, parse_action


@dataclass(frozen=True)
class GridEnvConfig:
    """Turn-loop knobs shared by the grid games.

    Attributes:
        max_steps: the episode ends (``truncated``) after this many turns.
        invalid_action_penalty: reward of a turn with no parsable action (the state does not
            change: a defined no-op). A parsed but blocked move (into a wall) is a no-op with
            the game's usual step reward.
        move_prompt: how each board asks for the move: ``"word"`` (default: "Which move do you
            make? Answer with one word: up, down, left or right.") or ``"tag"`` ("Reply with
            one move inside <action></action>: ..."). Both are parsed the same way
            (:func:`~gear_rl.envs.base.parse_action`); on SmolLM2-135M-Instruct (T=0.7, 32
            samples of 8 Sokoban levels) the one-word question got a parsable move in 14/32
            first turns, the tag request in 3/32.
    """

    max_steps: int = 20
    invalid_action_penalty: float = -0.1
    move_prompt: str = "word"

    def __post_init__(self) -> None:
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or (
                self.max_steps < 1):
            raise ValueError(f"max_steps must be an integer >= 1, got {self.max_steps!r}")
        if not math.isfinite(self.invalid_action_penalty):
            raise ValueError("invalid_action_penalty must be finite")
        if self.move_prompt not in ("word", "tag"):
            raise ValueError(f"move_prompt must be 'word' or 'tag', got {self.move_prompt!r}")


class GridTextEnv(TextEnv):
    """Plays a generated :class:`GridModel` level as a text game."""

    actions = tuple(DIRECTIONS)

    def __init__(self, config: GridEnvConfig) -> None:
        self.config = config
        self.model: GridModel[Any] | None = None
        self._state: Hashable | None = None
        self.steps = 0
        self.done = True

    @abstractmethod
    def generate(self, seed: int) -> GridModel[Any]:
        """The level for ``seed`` (deterministic)."""

    @abstractmethod
    def instructions(self) -> str:
        """The rules, shown once before the first board."""

    def _board(self) -> str:
        assert self.model is not None
        remaining = self.config.max_steps - self.steps
        left = f"{self.model.render(self._state)}\nSteps left: {remaining}."
        if self.config.move_prompt == "tag":
            return (f"{left} Reply with one move inside <action></action>: "
                    + ", ".join(self.actions) + ".")
        return (f"{left}\nWhich move do you make? Answer with one word: "
                + ", ".join(self.actions[:-1]) + f" or {self.actions[-1]}.")

    def reset(self, seed: int) -> str:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.model = self.generate(seed)
        self._state = self.model.initial_state()
        self.steps = 0
        self.done = False
        return f"{self.instructions()}\n\n{self._board()}"

    def step(self, action_text: str) -> StepResult:
        if self.model is None or self.done:
            raise RuntimeError("call reset() before step(), and again after an episode ends")
        action = parse_action(action_text, self.actions)
        self.steps += 1
        solved = False
        if action is None:
            reward = float(self.config.invalid_action_penalty)
            feedback = "No valid action found. Write one of " + ", ".join(self.actions) + (
                " inside <action></action>." if self.config.move_prompt == "tag" else ".")
            moved = False
        else:
            self._state, reward, solved, moved = self.model.transition(self._state, action)
            feedback = f"You moved {action}." if moved else f"You cannot move {action}."
        truncated = not solved and self.steps >= self.config.max_steps
        self.done = solved or truncated
        if solved:
            feedback += " Solved!"
        elif truncated:
            feedback += " Out of steps."
        info = {"action": action, "valid_action": action is not None and moved,
                "success": solved, "truncated": truncated, "shaping_reward": float(reward)}
        if solved:
            reward += self.model.solve_reward
        return StepResult(f"{feedback}\n{self._board()}", float(reward), self.done, info)

    @property
    def state_key(self) -> Hashable:
        if self.model is None:
            raise RuntimeError("call reset() first")
        return self._state

    def plan(self) -> list[str] | None:
        """A shortest solution from the current state (BFS), or ``None``."""
        if self.model is None:
            raise RuntimeError("call reset() first")
        return bfs_plan(self.model, self._state)
