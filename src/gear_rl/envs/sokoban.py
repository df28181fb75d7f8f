"""Text Sokoban with procedurally generated small solvable levels.

As in the GiGPO (arXiv 2505.10978) and Gated-BEPO Sokoban experiments: a small walled room
(6x6 by default), 1-2 boxes, a level accepted only when the BFS planner finds a solution
(within ``min_solution_length..max_solution_length`` moves). The default rewards follow the
usual text-Sokoban shaping (RAGEN / GiGPO): ``step_penalty`` every turn, ``box_reward`` for a
box pushed onto a target (minus it for one pushed off), ``solve_reward`` when every box is on a
target (the episode ends).

State key: ``(player, boxes)`` positions; the level (walls, targets) is fixed by the seed, so
two states of the same seed are equal exactly when their keys are.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gear_rl.envs.base import DIRECTIONS, GridModel, bfs_plan
from gear_rl.envs.grid import GridEnvConfig, GridTextEnv

Cell = tuple[int, int]
SokobanState = tuple[Cell, tuple[Cell, ...]]

LEGEND = ("Symbols: # wall, _ floor, O target, X box, * box on a target, P you, "
          "+ you on a target.")


@dataclass(frozen=True)
class SokobanConfig(GridEnvConfig):
    """Sokoban knobs.

    Attributes:
        height, width: room size including the border walls (4..10).
        num_boxes: boxes (and targets), 1..3.
        wall_prob: chance that an interior cell is an extra wall.
        min_solution_length, max_solution_length: accepted shortest-solution lengths.
        step_penalty: reward added every turn (also for a blocked or malformed move).
        box_reward: for each box pushed onto a target (minus for each pushed off).
        solve_reward: when all boxes are on targets (part of the environment's reward; the
            trainer pays a solve through its outcome reward instead, so step-level credit
            takes the rest, ``StepResult.info["shaping_reward"]``).
        max_attempts: level draws per seed before giving up (``RuntimeError``).
    """

    height: int = 6
    width: int = 6
    num_boxes: int = 1
    wall_prob: float = 0.1
    min_solution_length: int = 2
    max_solution_length: int = 12
    step_penalty: float = -0.1
    box_reward: float = 1.0
    solve_reward: float = 10.0
    max_attempts: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low, high in (("height", 4, 10), ("width", 4, 10), ("num_boxes", 1, 3),
                                ("min_solution_length", 1, 100),
                                ("max_solution_length", 1, 100), ("max_attempts", 1, 10**6)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        if self.min_solution_length > self.max_solution_length:
            raise ValueError("min_solution_length must be <= max_solution_length")
        if not 0.0 <= self.wall_prob <= 0.5:
            raise ValueError(f"wall_prob must be in [0, 0.5], got {self.wall_prob}")
        for name in ("step_penalty", "box_reward", "solve_reward"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")


class SokobanLevel(GridModel[SokobanState]):
    """One Sokoban level: walls, targets and the start state."""

    def __init__(self, walls: frozenset[Cell], targets: frozenset[Cell], player: Cell,
                 boxes: tuple[Cell, ...], height: int, width: int,
                 config: SokobanConfig) -> None:
        self.walls, self.targets = walls, targets
        self.start: SokobanState = (player, tuple(sorted(boxes)))
        self.height, self.width = height, width
        self.config = config
        self.solve_reward = config.solve_reward

    def initial_state(self) -> SokobanState:
        return self.start

    def transition(self, state: SokobanState, action: str
                   ) -> tuple[SokobanState, float, bool, bool]:
        (r, c), boxes = state
        dr, dc = DIRECTIONS[action]
        nxt = (r + dr, c + dc)
        reward = self.config.step_penalty
        if nxt in self.walls:
            return state, reward, False, False
        if nxt in boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in self.walls or beyond in boxes:
                return state, reward, False, False
            moved = tuple(sorted(beyond if b == nxt else b for b in boxes))
            reward += self.config.box_reward * ((beyond in self.targets)
                                                - (nxt in self.targets))
            boxes = moved
        solved = all(b in self.targets for b in boxes)
        return (nxt, boxes), reward, solved, True

    def render(self, state: SokobanState) -> str:
        player, boxes = state
        rows = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell = (r, c)
                if cell in self.walls:
                    row.append("#")
                elif cell == player:
                    row.append("+" if cell in self.targets else "P")
                elif cell in boxes:
                    row.append("*" if cell in self.targets else "X")
                else:
                    row.append("O" if cell in self.targets else "_")
            rows.append(" ".join(row))
        return "\n".join(rows)


def generate_sokoban(seed: int, config: SokobanConfig = SokobanConfig()) -> SokobanLevel:
    """The level for ``seed``: random interior walls, targets, boxes and player, redrawn until
    the BFS planner solves it in an accepted number of moves."""
    rng = random.Random(seed)
    h, w = config.height, config.width
    border = {(r, c) for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1)}
    interior = [(r, c) for r in range(1, h - 1) for c in range(1, w - 1)]
    for _ in range(config.max_attempts):
        extra = {cell for cell in interior if rng.random() < config.wall_prob}
        free = [cell for cell in interior if cell not in extra]
        if len(free) < 2 * config.num_boxes + 1:
            continue
        picks = rng.sample(free, 2 * config.num_boxes + 1)
        targets = frozenset(picks[:config.num_boxes])
        boxes = tuple(picks[config.num_boxes:2 * config.num_boxes])
        level = SokobanLevel(frozenset(border | extra), targets, picks[-1], boxes, h, w, config)
        plan = bfs_plan(level, max_states=50_000)
        if plan is not None and (config.min_solution_length <= len(plan)
                                 <= config.max_solution_length):
            return level
    raise RuntimeError(f"no solvable Sokoban level for seed {seed} in {config.max_attempts} "
                       "attempts; loosen the solution-length bounds or wall_prob")


class SokobanEnv(GridTextEnv):
    """Text Sokoban: ``reset(seed)`` generates the level, each turn is one move."""

    def __init__(self, config: SokobanConfig = SokobanConfig()) -> None:
        super().__init__(config)
        self.config: SokobanConfig = config

    def generate(self, seed: int) -> SokobanLevel:
        return generate_sokoban(seed, self.config)

    def instructions(self) -> str:
        return ("You are playing Sokoban. Push every box (X) onto a target (O). You push a box "
                "by walking into it; you cannot pull boxes or push two at once, and you cannot "
                f"walk through walls. {LEGEND} Moves: up, down, left, right.")
