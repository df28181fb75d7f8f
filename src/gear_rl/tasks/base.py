"""What the trainer needs from a task: problems with a chat prompt, a scorer, and the reference
the ground-truth-conditioned teacher is shown."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gear_rl.agent.tools.sandbox import DEFAULT_PACKAGES

if TYPE_CHECKING:
    from gear_rl.envs.base import TextEnv

DEFAULT_TRAIN_SIZE = 2000
"""Training problems of a task whose caller names no ``train_size``: reasoning-gym problems or
environment levels generated (dataset files keep all their rows); ``gear-rl train``'s
``train_size`` default."""
DEFAULT_EVAL_SIZE = 128
"""Held-out problems of a task whose caller names no ``eval_size`` (``gear-rl train`` passes
its ``eval.size``)."""


@dataclass(frozen=True)
class Problem:
    """One prompt to sample responses for.

    Attributes:
        id: stable identifier (unique within its split).
        prompt: the student's prompt as chat messages (``[{"role": "user", "content": ...}]``).
        answer: the gold final answer the scorer checks against.
        reference: what the teacher is conditioned on (the answer, or a full solution).
        reference_kind: ``"answer"`` or ``"solution"`` (see ``gear_rl.signals.teacher``).
        data_source: where it came from (reasoning-gym task name, a file's ``data_source``).
        metadata: anything the scorer needs (e.g. the reasoning-gym entry).
    """

    id: str
    prompt: list[dict[str, str]]
    answer: str
    reference: str
    reference_kind: str = "answer"
    data_source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class AgentSpec:
    """How the trainer rolls out a tool-using task (``gear_rl.agent.run_agent``).

    Attributes:
        tool: ``"python"``: calls run in a :class:`~gear_rl.agent.tools.PythonSandbox` and their
            output comes back as observation tokens; ``"none"``: the episode ends at the first
            call, which is scored against the reference without running it (function calling).
        tool_format: ``"python"`` (``<python>`` / ``<result>``), ``"markdown"`` (```` ```python ````
            / ```` ```output ````) or ``"json"`` (``<tool_call>`` / ``<tool_response>``).
        max_turns: policy turns per episode (the trainer's ``agent.max_turns`` overrides it).
        score_text: what the scorer reads: ``"final"`` (the last policy turn) or ``"policy"``
            (every policy turn, observations left out).
        sandbox_packages: the installed packages tool calls may import (with what they
            require); everything else in site-packages is invisible to them.
        turn_reward_tool: MT-GRPO's tool-execution turn reward (arXiv 2505.11821; the
            authors' rubric pays 0.2): a turn earns this times the share of its calls that ran
            without error (0 for a turn without a well-formed call).
        turn_reward_answer: MT-GRPO's answer-presence turn reward (their rubric: 0.5): a turn
            earns it when the task's scorer accepts the turn's tool output as the answer.
            The two are the per-turn ``step_rewards`` that ``turn_level`` normalises; both 0
            (the default): no turn rewards, and ``turn_level`` reduces to GRPO.
    """

    tool: str = "python"
    tool_format: str = "python"
    max_turns: int = 4
    score_text: str = "final"
    sandbox_packages: tuple[str, ...] = DEFAULT_PACKAGES
    turn_reward_tool: float = 0.0
    turn_reward_answer: float = 0.0

    def __post_init__(self) -> None:
        if self.tool not in ("python", "none"):
            raise ValueError(f"AgentSpec.tool must be 'python' or 'none', got {self.tool!r}")
        if self.score_text not in ("final", "policy"):
            raise ValueError("AgentSpec.score_text must be 'final' or 'policy', got "
                             f"{self.score_text!r}")
        for name in ("turn_reward_tool", "turn_reward_answer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value)):
                raise ValueError(f"AgentSpec.{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class EnvSpec:
    """A multi-turn environment task: each problem is one level (``problem.metadata["env_seed"]``)
    played turn by turn; the outcome reward is 1.0 when the level is solved, 0.0 otherwise, and
    the environment's shaped per-turn rewards are the step rewards (``gear_rl.credit.steps``).

    Attributes:
        make: a factory returning a fresh :class:`~gear_rl.envs.base.TextEnv`.
        max_turns: policy turns per episode (the environment's own step limit also applies).
    """

    make: Callable[[], TextEnv]
    max_turns: int = 10


@dataclass
class Task:
    """A task: a training split, a held-out split and a scorer.

    Attributes:
        name: human-readable description, logged in the run config.
        train: problems sampled for training.
        eval: held-out problems (never trained on) for Mean@k / pass@k.
        scorer: ``scorer(problem, response_text) -> float`` reward in [0, 1]; 1 means correct.
        extract: ``extract(response_text) -> str | None``, the answer the scorer read (for logs).
        agent: set for tool-using tasks (multi-turn rollouts with tool calls).
        env: set for multi-turn environment tasks (the scorer is not used: the environment
            decides success).
    """

    name: str
    train: Sequence[Problem]
    eval: Sequence[Problem]
    scorer: Callable[[Problem, str], float]
    extract: Callable[[str], str | None]
    agent: AgentSpec | None = None
    env: EnvSpec | None = None

    def __post_init__(self) -> None:
        if not self.train:
            raise ValueError(f"task {self.name!r} has no training problems")
        if not self.eval:
            raise ValueError(f"task {self.name!r} has no held-out problems")
        if self.agent is not None and self.env is not None:
            raise ValueError(f"task {self.name!r}: set agent or env, not both")

    def score(self, problem: Problem, response: str) -> float:
        """Reward of ``response`` (decoded text, end-of-turn token stripped) for ``problem``."""
        return float(self.scorer(problem, response))


Located = tuple[str, Problem]
"""A file's problem with its place in the file (``"PATH line N"``, ``"PATH row N"``)."""


def prompt_key(prompt: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """What the policy sees of a problem: its messages' roles and contents, exactly. Two rows
    with the same key are one problem (:func:`distinct_problems`)."""
    return tuple((str(message["role"]), str(message["content"])) for message in prompt)


def _repeats_note(repeats: list[tuple[str, Problem, str, Problem]]) -> str:
    """``"first: PLACE repeats PLACE"`` and, when some answers differ, how many and the first
    such pair with both answers."""
    place, _, first_place, _ = repeats[0]
    note = f"first: {place} repeats {first_place}"
    conflicts = [r for r in repeats if r[1].answer.strip() != r[3].answer.strip()]
    if conflicts:
        place, problem, first_place, first = conflicts[0]
        note += (f"; {len(conflicts)} of them with another answer than the row kept, first "
                 f"{place} ({problem.answer!r:.40}) against {first_place} "
                 f"({first.answer!r:.40}): check those rows")
    return note


def distinct_problems(
    located: Iterable[Located],
    *,
    split: str,
    source: str,
    limit: int | None = None,
) -> list[Located]:
    """One file's problems (with their places) once each, ids unique within the file.

    A problem is what the policy sees: its prompt (:func:`prompt_key`). A row whose prompt
    repeats an earlier row's is dropped (the first row is kept, as the verl data converter
    keeps it), and one warning counts the dropped rows and, separately, those whose answer
    differs from the kept row's: a repeated problem would otherwise be trained on more often
    than the rest, or held out and trained on at once. ``located`` is read lazily, in file
    order, until ``limit`` distinct problems are held (None: every row), so rows past the
    limit are never converted. Ids are made unique over the rows read
    (:func:`unique_problem_ids`) before any is dropped.
    """
    read: list[Located] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    rows = iter(located)
    while limit is None or len(seen) < limit:  # checked before the next row is converted
        item = next(rows, None)
        if item is None:
            break
        read.append(item)
        seen.add(prompt_key(item[1].prompt))
    renamed = unique_problem_ids([problem for _, problem in read], split=split, source=source)
    kept: dict[tuple[tuple[str, str], ...], Located] = {}
    repeats: list[tuple[str, Problem, str, Problem]] = []
    for (place, _), problem in zip(read, renamed, strict=True):
        first = kept.setdefault(prompt_key(problem.prompt), (place, problem))
        if first[1] is not problem:
            repeats.append((place, problem, *first))
    if repeats:
        warnings.warn(f"{source}: {len(repeats)} row(s) repeat the prompt of an earlier row "
                      f"and are left out, so each problem counts once "
                      f"({_repeats_note(repeats)})", stacklevel=2)
    return list(kept.values())


def split_train_eval(
    problems: Sequence[Located],
    held_out: Sequence[Located] | None,
    *,
    eval_size: int,
    seed: int,
    train_size: int | None,
    source: str,
    held_out_source: str | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Training and held-out problems of a file-backed task, no held-out prompt trained on.

    ``problems`` and ``held_out`` are files' distinct problems with their places
    (:func:`distinct_problems`). With ``held_out`` given (a separate evaluation file), train on
    the problems whose prompt is not held out (the others are dropped, with a warning);
    otherwise hold out ``min(eval_size, len(problems) // 2)`` of them, chosen by ``seed``.
    ``train_size`` caps the training problems (None: all). ``source`` names the training file
    in errors, as the user's ``task``, and ``held_out_source`` the held-out file, as
    ``eval_data``.
    """
    import random

    if not problems:
        raise ValueError(f"task {source!r}: the file holds no problems (no rows); give a file "
                         "with training rows")
    if held_out is not None and not held_out:
        raise ValueError(f"eval_data {held_out_source!r}: the file holds no problems (no rows); "
                         "give a file with held-out rows, or leave eval_data out to hold out "
                         "part of the task's")
    if held_out is None:
        if len(problems) < 2:
            raise ValueError(f"task {source!r}: {len(problems)} distinct problem(s) (rows with "
                             "the same prompt count once); need at least 2 to hold some out, "
                             "or give a separate held-out file (eval_data=...)")
        order = list(range(len(problems)))
        random.Random(seed).shuffle(order)
        cut = min(eval_size, len(problems) // 2)
        held_out = [problems[i] for i in sorted(order[:cut])]
        problems = [problems[i] for i in sorted(order[cut:])]
    else:
        held = {prompt_key(problem.prompt): (place, problem) for place, problem in held_out}
        overlap = [(place, problem, *held[prompt_key(problem.prompt)])
                   for place, problem in problems if prompt_key(problem.prompt) in held]
        if overlap:
            problems = [(place, problem) for place, problem in problems
                        if prompt_key(problem.prompt) not in held]
            if not problems:
                raise ValueError(f"task {source!r}: all {len(overlap)} of its problems are "
                                 "also in the held-out file (eval_data); give training rows "
                                 "the held-out file does not hold")
            warnings.warn(f"{source}: {len(overlap)} training row(s) have the prompt of a "
                          f"held-out problem and are left out of training "
                          f"({_repeats_note(overlap)})", stacklevel=2)
    train = [problem for _, problem in problems]
    if train_size is not None:
        train = train[:train_size]
    return train, [problem for _, problem in held_out]



def unique_problem_ids(problems: list[Problem], *, split: str, source: str) -> list[Problem]:
    """``problems`` (one file's rows, in file order) with ids unique within the file.

    A file's own ids repeat when two datasets were merged (both count ``extra_info.index`` from
    0); evaluation records and the trainer's logs key by problem id, so repeated ids would pair
    one row's results with another's prompt. When any id repeats, every problem of the file is
    renamed ``SPLIT/POSITION`` (its 0-based row position) and a warning says so once.
    """
    counts = Counter(problem.id for problem in problems)
    repeated = [problem_id for problem_id, count in counts.items() if count > 1]
    if not repeated:
        return problems
    warnings.warn(f"{source}: {len(repeated)} problem id(s) are shared by several rows (first: "
                  f"{repeated[0]!r}, {counts[repeated[0]]} rows); every row of this file is "
                  f"identified by its position instead ({split}/0, {split}/1, ...)",
                  stacklevel=2)
    return [dataclasses.replace(problem, id=f"{split}/{position}")
            for position, problem in enumerate(problems)]


def check_prompt_lengths(
    prompts: Iterable[tuple[str, Sequence[int]]],
    max_positions: int | None,
    *,
    new_tokens: int = 0,
    source: str,
) -> None:
    """Refuse prompts that do not fit the model's context, before any step runs.

    Refused, not truncated: cutting a prompt's start drops the instructions or the question,
    cutting its end drops the chat template's assistant header, and either way the reward would
    grade answers to a question the policy never saw. Rotary-position models run past their
    context with degraded outputs rather than failing, so nothing else catches this.

    Args:
        prompts: ``(problem id, prompt token ids)`` pairs; give each problem's longest prompt
            (the teacher's, which carries the reference, is the longer one).
        max_positions: the model's context, ``model.config.max_position_embeddings``; None: the
            model declares none, nothing is checked.
        new_tokens: tokens generated after the prompt (the larger of the rollout and evaluation
            budgets); prompt and response must fit together.
        source: the task, named in the error.

    Raises:
        ValueError: naming the first problem that does not fit, its length and the limit, and
            how many problems do not fit.
    """
    if max_positions is None:
        return
    if not isinstance(max_positions, int) or max_positions <= 0:
        raise ValueError(f"max_positions must be a positive int, got {max_positions!r}")
    if not isinstance(new_tokens, int) or new_tokens < 0:
        raise ValueError(f"new_tokens must be a non-negative int, got {new_tokens!r}")
    too_long: list[tuple[str, int]] = []
    total = 0
    for problem_id, ids in prompts:
        total += 1
        if len(ids) + new_tokens > max_positions:
            too_long.append((problem_id, len(ids)))
    if too_long:
        problem_id, length = too_long[0]
        raise ValueError(
            f"{source}: {len(too_long)} of {total} prompts do not fit the model's context; "
            f"problem {problem_id!r} has {length} prompt tokens + {new_tokens} new tokens > "
            f"max_position_embeddings {max_positions}: shorten or drop those rows, lower "
            "max_new_tokens, or use a model with a longer context")
