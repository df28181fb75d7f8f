"""Key-and-door: a small grid whose states repeat often (for the step-level estimators).

The room is split by a wall with one locked door. The key lies on the player's side, the goal
on the other. Walking onto the key picks it up; walking into the door with the key opens it
(and moves through); reaching the goal solves the level. The state is only
``(position, has_key, door_open)``, so wandering rollouts revisit the same states many times,
within a trajectory and across the trajectories of a prompt group: the setting in which
GiGPO's anchor groups, GAGPO's value proxy and Gated-BEPO's graph have data to pool.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gear_rl.envs.base import DIRECTIONS, GridModel
from gear_rl.envs.grid import GridEnvConfig, GridTextEnv

Cell = tuple[int, int]
KeyDoorState = tuple[Cell, bool, bool]


@dataclass(frozen=True)
class KeyDoorConfig(GridEnvConfig):
    """Key-and-door knobs.

    Attributes:
        height, width: room size including the border walls (height 4..9, width 5..9).
        step_penalty: reward added every turn.
        key_reward: for picking up the key.
        solve_reward: for reaching the goal (the episode ends; as in Sokoban, step-level
            credit in the trainer takes the reward without it).
    """

    height: int = 5
    width: int = 6
    step_penalty: float = 0.0
    key_reward: float = 0.0
    solve_reward: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low, high in (("height", 4, 9), ("width", 5, 9)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        for name in ("step_penalty", "key_reward", "solve_reward"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")


class KeyDoorLevel(GridModel[KeyDoorState]):
    """One key-and-door level."""

    def __init__(self, walls: frozenset[Cell], door: Cell, key: Cell, goal: Cell, player: Cell,
                 height: int, width: int, config: KeyDoorConfig) -> None:
        self.walls, self.door, self.key, self.goal = walls, door, key, goal
        self.start: KeyDoorState = (player, False, False)
        self.height, self.width = height, width
        self.config = config
        self.solve_reward = config.solve_reward

    def initial_state(self) -> KeyDoorState:
        return self.start

    def transition(self, state: KeyDoorState, action: str
                   ) -> tuple[KeyDoorState, float, bool, bool]:
        (r, c), has_key, door_open = state
        dr, dc = DIRECTIONS[action]
        nxt = (r + dr, c + dc)
        reward = self.config.step_penalty
        if nxt in self.walls or (nxt == self.door and not (door_open or has_key)):
            return state, reward, False, False
        if nxt == self.door:
            door_open = True
        if nxt == self.key and not has_key:
            has_key = True
            reward += self.config.key_reward
        solved = nxt == self.goal
        return (nxt, has_key, door_open), reward, solved, True

    def render(self, state: KeyDoorState) -> str:
        player, has_key, door_open = state
        rows = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell = (r, c)
                if cell == player:
                    row.append("P")
                elif cell in self.walls:
                    row.append("#")
                elif cell == self.door:
                    row.append("/" if door_open else "D")
                elif cell == self.key and not has_key:
                    row.append("K")
                elif cell == self.goal:
                    row.append("G")
                else:
                    row.append("_")
            rows.append(" ".join(row))
        status = "You hold the key." if has_key else "You do not have the key."
        return "\n".join(rows) + "\n" + status


def generate_keydoor(seed: int, config: KeyDoorConfig = KeyDoorConfig()) -> KeyDoorLevel:
    """The level for ``seed``: a dividing wall column with a door, key and player on the left,
    goal on the right (solvable by construction; the tests check it with the BFS planner)."""
    rng = random.Random(seed)
    h, w = config.height, config.width
    wall_col = rng.randint(2, w - 3)
    door = (rng.randint(1, h - 2), wall_col)
    walls = {(r, c) for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1)}
    walls |= {(r, wall_col) for r in range(1, h - 1) if (r, wall_col) != door}
    left = [(r, c) for r in range(1, h - 1) for c in range(1, wall_col)]
    right = [(r, c) for r in range(1, h - 1) for c in range(wall_col + 1, w - 1)]
    key, player = rng.sample(left, 2)  # left has >= 2 cells: height >= 4, wall_col >= 2
    goal = rng.choice(right)
    return KeyDoorLevel(frozenset(walls), door, key, goal, player, h, w, config)


class KeyDoorEnv(GridTextEnv):
    """Text key-and-door: ``reset(seed)`` generates the level, each turn is one move."""

    def __init__(self, config: KeyDoorConfig = KeyDoorConfig()) -> None:
        super().__init__(config)
        self.config: KeyDoorConfig = config

    def generate(self, seed: int) -> KeyDoorLevel:
        return generate_keydoor(seed, self.config)

    def instructions(self) -> str:
        return ("You are in a room split by a wall with a locked door (D). Pick up the key (K) "
                "by walking onto it, walk through the door, and reach the goal (G). Symbols: "
                "# wall, _ floor, / open door, P you. Moves: up, down, left, right.")
