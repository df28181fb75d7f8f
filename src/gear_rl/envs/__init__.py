"""Multi-turn text environments with hashable states, for the step-level credit estimators.

``base.py``: the :class:`TextEnv` interface (``reset(seed) -> observation``,
``step(action_text) -> StepResult``, ``state_key``), action parsing, the BFS planner.
``sokoban.py``: text Sokoban with generated solvable levels. ``keydoor.py``: a key-and-door grid
whose states repeat often. ``textarena.py``: single-player TextArena grid games (FrozenLake,
Sokoban; optional dependency), with a planner over the game's state.
"""

from gear_rl.envs.base import DIRECTIONS, GridModel, StepResult, TextEnv, bfs_plan, parse_action
from gear_rl.envs.grid import GridEnvConfig, GridTextEnv
from gear_rl.envs.keydoor import KeyDoorConfig, KeyDoorEnv, KeyDoorLevel, generate_keydoor
from gear_rl.envs.sokoban import SokobanConfig, SokobanEnv, SokobanLevel, generate_sokoban
from gear_rl.envs.textarena import TEXTARENA_GAMES, TextArenaConfig, TextArenaEnv

__all__ = [
    "DIRECTIONS",
    "TEXTARENA_GAMES",
    "GridEnvConfig",
    "GridModel",
    "GridTextEnv",
    "KeyDoorConfig",
    "KeyDoorEnv",
    "KeyDoorLevel",
    "SokobanConfig",
    "SokobanEnv",
    "SokobanLevel",
    "StepResult",
    "TextArenaConfig",
    "TextArenaEnv",
    "TextEnv",
    "bfs_plan",
    "generate_keydoor",
    "generate_sokoban",
    "parse_action",
]
