"""Procedural tasks from ``reasoning-gym`` (offline, seeded, each with its own scorer).

Presets (measured on the bundled SmolLM2-135M-Instruct, 48-64 held-out problems x 4 samples,
temperature 0.6, top-p 0.95, 32-48 new tokens, answer = last number):

- ``products`` (the trainer's default): one-digit products ("Solve the following
  multiplication: 4 * 7. Give only the result as your final answer."). Mean@4 46-47%, pass@4
  79-91%: most K=8 groups have mixed outcomes, and the gap between Mean@k and pass@k is what RL
  can close. Only 100 distinct questions exist; the held-out questions never appear in training.
- ``arithmetic``: ``basic_arithmetic`` with two one-digit terms, ``+``/``-`` (negatives and
  parentheses allowed): Mean@4 14% (16% with "Give only the result as your final answer."
  appended), pass@4 29-36%; about a thousand distinct questions.
- ``arithmetic-3``: 2-3 terms of 1-2 digits, harder.

Harder settings (word problems, equations) sit near 0% for a 135M model: every group is
all-wrong and the outcome advantage is zero everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gear_rl.tasks.answers import ANSWER_RULES
from gear_rl.tasks.base import DEFAULT_EVAL_SIZE, DEFAULT_TRAIN_SIZE, Problem, Task

__all__ = ["PRESETS", "reasoning_gym_task"]

PRESETS: Mapping[str, tuple[str, dict[str, Any]]] = {
    "arithmetic": ("basic_arithmetic", {
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
        "operators": ["+", "-"],
    }),
    "arithmetic-3": ("basic_arithmetic", {
        "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2,
        "operators": ["+", "-"],
    }),
    "products": ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
}
"""Named task settings: preset -> (reasoning-gym dataset, its config)."""

DEFAULT_INSTRUCTION = ""


def reasoning_gym_task(
    name: str,
    *,
    options: Mapping[str, Any] | None = None,
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    instruction: str = DEFAULT_INSTRUCTION,
    partial_credit: bool = False,
) -> Task:
    """A reasoning-gym dataset (or a preset from ``PRESETS``) as a :class:`Task`.

    Args:
        name: a preset name or any reasoning-gym dataset name (``basic_arithmetic``,
            ``products``, ``chain_sum``, ``gsm_symbolic``, ...).
        options: dataset config overrides (for a preset: on top of the preset's), and
            ``answer_rule``, this project's own: what the scorer reads (a key of
            :data:`~gear_rl.tasks.answers.ANSWER_RULES`; default ``final``).
        train_size: problems in the training split.
        eval_size: held-out problems; generated from a different seed, and any training problem
            whose question is also in the held-out split is dropped, so none is seen in training.
        seed: data seed (the held-out split uses ``seed + 1_000_003``).
        instruction: text appended to every question (e.g. a format request).
        partial_credit: keep reasoning-gym's partial scores (e.g. 0.5 for "-2" against "2",
            because its default scorer rewards containing the answer); default False: reward 1
            when the score is 1, else 0.

    Returns:
        :class:`Task` whose reference (for the teacher) is the gold answer.
    """
    import reasoning_gym

    options = dict(options or {})
    rule = options.pop("answer_rule", "final")
    if rule not in ANSWER_RULES:
        raise ValueError(f"task_options.answer_rule must be one of {sorted(ANSWER_RULES)}, got "
                         f"{rule!r}")
    extract = ANSWER_RULES[rule]
    if name in PRESETS:
        dataset_name, config = PRESETS[name][0], {**PRESETS[name][1], **options}
    else:
        dataset_name, config = name, options
    if dataset_name not in reasoning_gym.factory.DATASETS:
        raise ValueError(
            f"unknown task {name!r}: not a preset {sorted(PRESETS)} nor a reasoning-gym dataset "
            f"(e.g. {sorted(reasoning_gym.factory.DATASETS)[:8]}...), nor a .parquet/.jsonl file"
        )
    if train_size < 1 or eval_size < 1:
        raise ValueError(f"train_size and eval_size must be >= 1, got {train_size}, {eval_size}")
    try:
        eval_data = reasoning_gym.create_dataset(dataset_name, size=eval_size,
                                                 seed=seed + 1_000_003, **config)
        train_data = reasoning_gym.create_dataset(dataset_name, size=train_size, seed=seed,
                                                  **config)
    except (TypeError, AssertionError) as error:
        raise ValueError(f"bad options for reasoning-gym {dataset_name!r}: {error}") from error

    def problems(data, split: str, exclude: set[str]) -> list[Problem]:
        out = []
        for index in range(len(data)):
            entry = data[index]
            if entry["question"] in exclude:
                continue
            content = entry["question"] + instruction
            out.append(Problem(
                id=f"{dataset_name}/{split}/{index}",
                prompt=[{"role": "user", "content": content}],
                answer=str(entry["answer"]),
                reference=str(entry["answer"]),
                reference_kind="answer",
                data_source=f"reasoning_gym/{dataset_name}",
                metadata={"entry": entry},
            ))
        return out

    eval_problems = problems(eval_data, "eval", set())
    train_problems = problems(train_data, "train", {p.metadata["entry"]["question"]
                                                    for p in eval_problems})

    def scorer(problem: Problem, response: str) -> float:
        answer = extract(response)
        score = float(train_data.score_answer(answer, problem.metadata["entry"]))
        return score if partial_credit else float(score >= 1.0)

    read = "" if rule == "final" else f" (scored on the {rule.replace('_', ' ')})"
    return Task(name=f"reasoning_gym/{dataset_name} {config}{read}", train=train_problems,
                eval=eval_problems, scorer=scorer, extract=extract)
