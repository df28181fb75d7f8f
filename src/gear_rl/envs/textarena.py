"""Adapter for single-player games of TextArena (PyPI ``textarena``, MIT), which run offline.

Chosen because its games are procedurally generated in pure Python (no game files, no network),
include Sokoban and FrozenLake (the GiGPO/Gated-BEPO grid tasks), and expose the board as text,
which gives a hashable state key. Other text-game packages were tried for this and did not fit:
``jericho`` needs Z-machine game files downloaded separately; ``textworld`` compiles games with
an external Inform 7 toolchain; ``textworld-express`` runs on a JVM.

``textarena`` is optional: importing this module works without it; constructing
:class:`TextArenaEnv` raises ``ImportError`` naming the package. (Its own import pulls in
``nltk``, ``chess``, ``python-dotenv``, ``websockets`` and ``openai``, its declared
dependencies; no network is used.)

The policy's text is parsed with :func:`gear_rl.envs.base.parse_action` and sent to the game as
``[move]``; a turn with no parsable move is the same defined no-op as in the built-in games
(``invalid_action_penalty``, nothing sent). The step reward is 0 until the game ends, then the
game's final reward for player 0. The state key is the last board the game showed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

from gear_rl.envs.base import StepResult, TextEnv, parse_action

DEFAULT_ACTIONS = ("up", "down", "left", "right")


class TextArenaEnv(TextEnv):
    """A single-player TextArena game as a :class:`~gear_rl.envs.base.TextEnv`.

    Args:
        env_id: a TextArena id, e.g. ``"Sokoban-v0"`` or ``"FrozenLake-v0"``.
        actions: the move names the game accepts inside brackets.
        max_steps: the episode ends (``truncated``) after this many turns.
        invalid_action_penalty: reward of a turn with no parsable move.
    """

    def __init__(self, env_id: str = "Sokoban-v0", actions: tuple[str, ...] = DEFAULT_ACTIONS,
                 max_steps: int = 20, invalid_action_penalty: float = -0.1) -> None:
        try:
            import textarena
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("TextArenaEnv needs the 'textarena' package "
                              "(pip install textarena)") from err
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if not math.isfinite(invalid_action_penalty):
            raise ValueError("invalid_action_penalty must be finite")
        self._textarena = textarena
        self.env_id = env_id
        self.actions = tuple(actions)
        self.max_steps = max_steps
        self.invalid_action_penalty = float(invalid_action_penalty)
        self._game: Any = None
        self._board = ""
        self.steps = 0
        self.done = True

    def _observe(self) -> str:
        _, messages = self._game.get_observation()
        texts = []
        for _, text, kind in messages:
            if "GAME_BOARD" in str(kind):
                self._board = text
            if "PLAYER_ACTION" not in str(kind):
                texts.append(text.strip())
        return "\n".join(texts)

    def reset(self, seed: int) -> str:
        game = self._textarena.make(self.env_id)
        while hasattr(game, "env"):  # drop TextArena's LLM wrappers: we format actions ourselves
            game = game.env
        self._game = game
        self._game.reset(num_players=1, seed=seed)
        self.steps = 0
        self.done = False
        return self._observe()

    def step(self, action_text: str) -> StepResult:
        if self._game is None or self.done:
            raise RuntimeError("call reset() before step(), and again after an episode ends")
        action = parse_action(action_text, self.actions)
        self.steps += 1
        reward = 0.0
        success = False
        if action is None:
            reward = self.invalid_action_penalty
            observation = ("No valid action found. Write one of " + ", ".join(self.actions)
                           + " inside <action></action>.\n" + self._board)
            finished = False
        else:
            finished, _ = self._game.step(f"[{action}]")
            observation = self._observe()
            if finished:
                rewards = self._game.state.rewards or {}
                reward = float(rewards.get(0, 0.0))
                success = reward > 0
        truncated = not finished and self.steps >= self.max_steps
        self.done = bool(finished) or truncated
        info = {"action": action, "valid_action": action is not None, "success": success,
                "truncated": truncated}
        return StepResult(observation, reward, self.done, info)

    @property
    def state_key(self) -> Hashable:
        if self._game is None:
            raise RuntimeError("call reset() first")
        return self._board
