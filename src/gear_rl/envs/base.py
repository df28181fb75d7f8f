"""The multi-turn text environment interface, action parsing, and the BFS planner.

An environment is played one policy turn at a time: ``reset(seed)`` gives the first observation
text, ``step(action_text)`` takes the policy's whole turn text, parses an action from it, and
returns the next observation, the reward, whether the episode ended, and an info dict.
``state_key`` is a hashable key of the current state: the step-level credit estimators
(``gear_rl.credit.steps``) group steps taken in equal states of the same prompt (same seed).

Built-in grid games also expose their dynamics as pure functions on hashable states
(:class:`GridModel`), which :func:`bfs_plan` searches: the tests' scripted planner.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "DIRECTIONS",
    "GridModel",
    "StepResult",
    "TextEnv",
    "bfs_plan",
    "parse_action",
]

DIRECTIONS: dict[str, tuple[int, int]] = {
    "up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1),
}
_TAGGED = re.compile(r"<action>\s*(.*?)\s*</action>", re.IGNORECASE | re.DOTALL)


def parse_action(text: str, actions: Sequence[str]) -> str | None:
    """The action named in a policy's turn ``text``, or ``None`` when there is none.

    Rules, in order: the content of the last ``<action>...</action>`` tag, if it is one of
    ``actions`` (case and surrounding whitespace/brackets ignored; a tag with anything else
    makes the turn malformed, even if a bare action word appears elsewhere); otherwise, with no
    tag at all, the last whole word in ``text`` that is one of ``actions``.
    """
    if not isinstance(text, str):
        raise ValueError(f"action text must be a str, got {type(text).__name__}")
    names = {a.lower(): a for a in actions}
    tagged = _TAGGED.findall(text)
    if tagged:
        return names.get(tagged[-1].strip(" []").lower())
    pattern = r"\b(" + "|".join(re.escape(a) for a in sorted(names, key=len, reverse=True)) + r")\b"
    words = re.findall(pattern, text.lower())
    return names[words[-1]] if words else None


@dataclass(frozen=True)
class StepResult:
    """What one ``step`` returns.

    Attributes:
        observation: the text the policy sees next.
        reward: the reward for this step, the reward for solving the level included.
        done: the episode has ended (solved, or the step limit reached).
        info: ``action`` (parsed, or ``None``), ``valid_action`` (parsed and legal),
            ``success`` (solved), ``truncated`` (the step limit ended it),
            ``shaping_reward`` (the part of ``reward`` that does not pay for solving: equal to
            ``reward`` on every step but a solving one; an environment that leaves it out
            declares that none of its rewards pays for solving), and env extras.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(ABC):
    """A multi-turn text environment with hashable states."""

    #: the action names ``step`` understands
    actions: tuple[str, ...] = ()

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode (the same seed gives the same level); return the first
        observation."""

    @abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Parse an action from the policy's turn text and apply it."""

    @property
    @abstractmethod
    def state_key(self) -> Hashable:
        """A hashable key of the current state (equal keys = the same state of this level)."""


S = TypeVar("S", bound=Hashable)


class GridModel(ABC, Generic[S]):
    """Pure dynamics of a built-in level: what :func:`bfs_plan` searches."""

    actions: tuple[str, ...] = tuple(DIRECTIONS)
    #: paid on top of ``transition``'s reward for a move that solves the level
    solve_reward: float = 0.0

    @abstractmethod
    def initial_state(self) -> S:
        """The level's start state."""

    @abstractmethod
    def transition(self, state: S, action: str) -> tuple[S, float, bool, bool]:
        """``(next_state, reward, solved, moved)``; an illegal move returns ``moved=False``.
        ``reward`` leaves out :attr:`solve_reward`, which the environment adds."""

    @abstractmethod
    def render(self, state: S) -> str:
        """The board as text."""


def bfs_plan(model: GridModel[S], state: S | None = None, max_states: int = 200_000
             ) -> list[str] | None:
    """A shortest action sequence from ``state`` (default: the start) to a solved state, or
    ``None`` when none exists within ``max_states`` expanded states."""
    start = model.initial_state() if state is None else state
    parents: dict[Hashable, tuple[Hashable, str] | None] = {start: None}
    queue: deque[Hashable] = deque([start])
    while queue and len(parents) <= max_states:
        current = queue.popleft()
        for action in model.actions:
            nxt, _, solved, moved = model.transition(current, action)  # type: ignore[arg-type]
            if not moved or nxt in parents:
                continue
            parents[nxt] = (current, action)
            if solved:
                plan = []
                node: Hashable = nxt
                while parents[node] is not None:
                    node, step = parents[node]  # type: ignore[misc]
                    plan.append(step)
                return plan[::-1]
            queue.append(nxt)
    return None
