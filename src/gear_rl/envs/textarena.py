"""Single-player grid games of TextArena (PyPI ``textarena``, MIT), which run offline.

Chosen because its games are procedurally generated in pure Python (no game files, no network),
include Sokoban and FrozenLake (the GiGPO/Gated-BEPO grid tasks), and expose the board as text,
which gives a hashable state key. Other text-game packages were tried for this and did not fit:
``jericho`` needs Z-machine game files downloaded separately; ``textworld`` compiles games with
an external Inform 7 toolchain; ``textworld-express`` runs on a JVM.

Supported games (:data:`TEXTARENA_GAMES`), all played with the moves up, down, left, right:

- ``FrozenLake-v0`` (4x4, 3 holes), ``FrozenLake-v0-random`` (start and goal in random opposite
  corners), ``FrozenLake-v0-hardcore`` (5x5, 6 holes): walk to the goal without falling in a hole.
- ``Sokoban-v0`` (6x6 room, 3 boxes). TextArena draws its levels by a reverse-play search, about
  0.1 s a level on one CPU core (built-in :class:`~gear_rl.envs.SokobanEnv`: milliseconds).

Left out: ``Sokoban-v0-medium`` (about 20 s to draw one level); ``FifteenPuzzle-v0`` and the
2048 games, which have no shortest solution to show the teacher (a shuffled 15-puzzle is beyond
breadth-first search, 2048 spawns tiles at random); games whose moves are not a fixed list of
words (Wordle, Hangman, Minesweeper...); games for two or more players.

The policy's text is parsed with :func:`gear_rl.envs.base.parse_action` and sent to the game as
``[move]``; a turn with no parsable move is the same defined no-op as in the built-in games
(``invalid_action_penalty``, nothing sent). A blocked move (into a wall) is the game's own
invalid move: TextArena warns once and ends the game on a second one in a row. The step reward
is 0 until the game ends, then the game's final reward for player 0: 1.0 for a solved level,
otherwise the fraction of the way it got (boxes on targets, distance to the goal). Success is a
solved level; its reward is all solve reward (``shaping_reward`` 0), a lost game's fraction is all
shaping. The state key is the last board the game showed. :meth:`TextArenaEnv.plan` finds a
shortest solution by the breadth-first planner over the game's own state (walls, boxes, holes).

TextArena reseeds Python's global ``random`` on every reset; the adapter gives each game its own
copy of that state, so playing leaves the caller's ``random`` untouched.

``textarena`` is optional: importing this module works without it; constructing
:class:`TextArenaEnv` raises ``ImportError`` naming the package. (Its own import pulls in
``nltk``, ``chess``, ``python-dotenv``, ``websockets`` and ``openai``, its declared
dependencies; no network is used.)
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from gear_rl.envs.base import DIRECTIONS, GridModel, StepResult, TextEnv, bfs_plan, parse_action
from gear_rl.envs.sokoban import SokobanConfig, SokobanLevel

__all__ = ["TEXTARENA_GAMES", "TextArenaConfig", "TextArenaEnv"]

Cell = tuple[int, int]


class FrozenLakeModel(GridModel[Cell]):
    """FrozenLake dynamics for the planner: state = the player's cell. Stepping off the grid is
    blocked; a hole loses the game, so the planner treats it as blocked too."""

    def __init__(self, grid: list[list[str]], player: Cell) -> None:
        self.grid, self.player = grid, player

    def initial_state(self) -> Cell:
        return self.player

    def transition(self, state: Cell, action: str) -> tuple[Cell, float, bool, bool]:
        dr, dc = DIRECTIONS[action]
        r, c = state[0] + dr, state[1] + dc
        if not (0 <= r < len(self.grid) and 0 <= c < len(self.grid[0])) or self.grid[r][c] == "H":
            return state, 0.0, False, False
        return (r, c), 0.0, self.grid[r][c] == "G", True

    def render(self, state: Cell) -> str:
        return "\n".join("".join("P" if (r, c) == state else cell for c, cell in enumerate(row))
                         for r, row in enumerate(self.grid))


def _frozen_lake_model(game: Any) -> FrozenLakeModel:
    state = game.state.game_state
    return FrozenLakeModel([list(row) for row in state["grid"]], tuple(state["player_pos"]))


def _sokoban_model(game: Any) -> SokobanLevel:
    """The game's level in the built-in Sokoban's dynamics (the same push rules). TextArena's
    cell codes: ``room_fixed`` 0 wall, 2 target; ``room_state`` 3/4 box (on a target / not),
    5 player."""
    height, width = game.room_fixed.shape
    cells = [(r, c) for r in range(height) for c in range(width)]
    ring = {(r, c) for r in range(-1, height + 1) for c in range(-1, width + 1)} - set(cells)
    walls = frozenset(ring | {cell for cell in cells if game.room_fixed[cell] == 0})
    targets = frozenset(cell for cell in cells if game.room_fixed[cell] == 2)
    boxes = tuple(cell for cell in cells if game.room_state[cell] in (3, 4))
    [player] = [cell for cell in cells if game.room_state[cell] == 5]
    return SokobanLevel(walls, targets, player, boxes, height, width, SokobanConfig())


TEXTARENA_GAMES: dict[str, Callable[[Any], GridModel[Any]]] = {
    "FrozenLake-v0": _frozen_lake_model,
    "FrozenLake-v0-random": _frozen_lake_model,
    "FrozenLake-v0-hardcore": _frozen_lake_model,
    "Sokoban-v0": _sokoban_model,
}
"""The supported TextArena ids, each with the planner model of its current state."""


@dataclass(frozen=True)
class TextArenaConfig:
    """A TextArena game and the adapter's turn-loop knobs.

    Attributes:
        game: a TextArena id from :data:`TEXTARENA_GAMES`.
        max_steps: the episode ends (``truncated``) after this many turns (the game's own turn
            limit also applies).
        invalid_action_penalty: reward of a turn with no parsable move (nothing is sent).
    """

    game: str = "FrozenLake-v0"
    max_steps: int = 20
    invalid_action_penalty: float = -0.1

    def __post_init__(self) -> None:
        if self.game not in TEXTARENA_GAMES:
            raise ValueError(f"unsupported TextArena game {self.game!r}; choose from "
                             + ", ".join(TEXTARENA_GAMES))
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or (
                self.max_steps < 1):
            raise ValueError(f"max_steps must be an integer >= 1, got {self.max_steps!r}")
        if not math.isfinite(self.invalid_action_penalty):
            raise ValueError("invalid_action_penalty must be finite")


class TextArenaEnv(TextEnv):
    """A single-player TextArena game as a :class:`~gear_rl.envs.base.TextEnv`."""

    actions = tuple(DIRECTIONS)

    def __init__(self, config: TextArenaConfig = TextArenaConfig()) -> None:
        try:
            import textarena
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("TextArenaEnv needs the 'textarena' package "
                              "(pip install 'gear-rl[envs]')") from err
        self._textarena = textarena
        self.config = config
        self._game: Any = None
        self._random_state: Any = None
        self._board = ""
        self.steps = 0
        self.done = True

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run the game on its own ``random`` state, leaving the caller's as it was."""
        outer = random.getstate()
        if self._random_state is not None:
            random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)

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
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        game = self._textarena.make(self.config.game)
        while hasattr(game, "env"):  # drop TextArena's LLM wrappers: we format actions ourselves
            game = game.env
        self._game = game
        self._random_state = None
        with self._own_random():
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
        legal = action is not None
        if action is None:
            reward = self.config.invalid_action_penalty
            observation = ("No valid action found. Write one of " + ", ".join(self.actions)
                           + " inside <action></action>.\n" + self._board)
            finished = False
        else:
            with self._own_random():
                finished, _ = self._game.step(f"[{action}]")
            observation = self._observe()
            state = self._game.state
            # a warned invalid move leaves error_count at 1; a second one ends the game
            legal = not (state.error_count or state.game_info[0].get("invalid_move"))
            if finished:
                reward = float((self._game.state.rewards or {}).get(0, 0.0))
                success = reward >= 1.0  # a lost game scores its fraction of the way, below 1
        truncated = not finished and self.steps >= self.config.max_steps
        self.done = bool(finished) or truncated
        info = {"action": action, "valid_action": legal, "success": success,
                "truncated": truncated, "shaping_reward": 0.0 if success else reward}
        return StepResult(observation, reward, self.done, info)

    @property
    def state_key(self) -> Hashable:
        if self._game is None:
            raise RuntimeError("call reset() first")
        return self._board

    def plan(self) -> list[str] | None:
        """A shortest solution from the current state (BFS), or ``None``."""
        if self._game is None:
            raise RuntimeError("call reset() first")
        return bfs_plan(TEXTARENA_GAMES[self.config.game](self._game))
