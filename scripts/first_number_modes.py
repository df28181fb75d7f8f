"""What each cell of step 5's task writes first (issue 39, ``products_first``): the product, or
a number of the question restated.

    python scripts/first_number_modes.py [results/study/credit_control] [--step N]

``products_first`` scores a response by its first number (``task_options.answer_rule=
first_number``). A response that restates the question ("To solve 9 * 8, ...") starts with a
factor, which is right exactly where that factor equals the product (``a * 1``, ``0 * b``...).
For every finished cell of the task, this reads the held-out eval records at the final step (or
``--step``: each sample's extracted first number) and the task's held-out problems (built from
the cells' config as the trainer builds them, ``config_task``; no model), and prints per cell
the share of samples whose first number is the product, the first factor, the second factor
(when it is not also the product), or something else, beside the cell's score. The line above
the table gives the score of a policy that always writes the first factor first.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from gear_rl.rundir import read_eval_records
from gear_rl.train import load_config
from gear_rl.train.runtime import config_task

TASK = "products_first"
QUESTION = re.compile(r"(-?\d+)\s*[*x×]\s*(-?\d+)")


def factors(problems: list) -> dict[str, tuple[int, int]]:
    """Problem id -> the question's two factors."""
    found = {}
    for problem in problems:
        match = QUESTION.search(problem.prompt[-1]["content"])
        if match is None:
            raise ValueError(f"{problem.id}: no 'a * b' in its question")
        found[problem.id] = (int(match.group(1)), int(match.group(2)))
    return found


def classify(first: str | None, answer: int, a: int, b: int) -> str:
    if first is None or not re.fullmatch(r"-?\d+", str(first)):
        return "other"
    value = int(first)
    if value == answer:
        return "product"
    return "first factor" if value == a else "second factor" if value == b else "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", nargs="?", default="results/study/credit_control")
    parser.add_argument("--step", type=int, default=None, help="eval step (default: the last)")
    args = parser.parse_args(argv)
    cells = Path(args.study) / "cells" / TASK
    configs = sorted(cells.glob("*-s*.yaml"))
    if not configs:
        print(f"no cells of {TASK} under {cells}", file=sys.stderr)
        return 2
    task = config_task(load_config(configs[0], []))  # every cell's problems are the same
    question = factors(task.eval)
    answers = {p.id: int(p.answer) for p in task.eval}
    restated = sum(question[i][0] == answers[i] for i in question) / len(question)
    print(f"{len(question)} held-out problems; a policy that always writes the first factor "
          f"first scores {restated:.3f}.\n")
    kinds = ("product", "first factor", "second factor", "other")
    print("| cell | step | Mean@k | " + " | ".join(kinds) + " |")
    print("|---|---|---|" + "---|" * len(kinds))
    for path in configs:
        run = path.with_suffix("")
        if not (run / "summary.json").is_file():
            continue
        by_step = read_eval_records(run)
        step = max(by_step, default=None) if args.step is None else args.step
        if step not in by_step:
            continue
        records = by_step[step]
        counts = dict.fromkeys(kinds, 0)
        right = total = 0
        for record in records["records"]:
            a, b = question[record["id"]]
            for first, reward in zip(record["extracted"], record["rewards"], strict=True):
                counts[classify(first, answers[record["id"]], a, b)] += 1
                right += reward >= 1
                total += 1
        shares = " | ".join(f"{counts[k] / total:.2f}" for k in kinds)
        print(f"| {run.name} | {records['step']} | {right / total:.3f} | {shares} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
