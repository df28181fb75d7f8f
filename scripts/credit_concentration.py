"""Where the Monte-Carlo truth puts the credit on a task scored on the first number, and where
each estimator puts it (issue 39, step 5).

    python scripts/credit_concentration.py CREDIT_CHECK_JSON > DIR/concentration.md

For every trajectory of a credit check (``gear-rl credit-check ... out=DIR`` writes
``DIR/credit_check.json``) of a task with ``task_options.answer_rule=first_number``, the
*decisive prefix* is the response's tokens up to and including the last token of its first
number (:func:`gear_rl.tasks.answers.first_number_span`): nothing after it can change the
reward. Prints, over the trajectories that contain a number, the decisive prefix's share of the
response's tokens, and its share of the total absolute per-token advantage ``sum |A_t|`` of the
Monte-Carlo truth (``mc_advantage``) and of each scored estimator (``advantages``): a share near
the token share is uniform credit (GRPO's), a share near the truth's is credit in the right
place. Shares are pooled (sums over all trajectories, then divided) and averaged per trajectory.
Needs no model: the per-token numbers are the check's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gear_rl.tasks.answers import first_number_span


def decisive_length(tokens: list[str]) -> int | None:
    """Tokens up to and including the one where the response's first number ends (None: the
    response has no number)."""
    span = first_number_span("".join(tokens))
    if span is None:
        return None
    end, length = span[1], 0
    for index, piece in enumerate(tokens):
        length += len(piece)
        if length >= end:
            return index + 1
    return len(tokens)


def shares(trajectories: list[dict]) -> dict[str, dict[str, float]]:
    """``{signal: {"pooled": share, "mean": share}}`` of ``sum |A_t|`` on the decisive prefix,
    for ``tokens`` (policy tokens), ``mc_advantage`` and every estimator in ``advantages``."""
    sums: dict[str, list[float]] = {}  # signal -> [prefix, total]
    per: dict[str, list[float]] = {}
    for traj in trajectories:
        cut = decisive_length(traj["tokens"])
        if cut is None:
            continue
        mask = traj["mask"]
        signals = {"tokens": [float(m) for m in mask], "mc_advantage": traj["mc_advantage"],
                   **traj["advantages"]}
        for name, values in signals.items():
            magnitude = [abs(v) * m for v, m in zip(values, mask, strict=True)]
            prefix, total = sum(magnitude[:cut]), sum(magnitude)
            pooled = sums.setdefault(name, [0.0, 0.0])
            pooled[0] += prefix
            pooled[1] += total
            if total > 0:
                per.setdefault(name, []).append(prefix / total)
    return {name: {"pooled": prefix / total if total else float("nan"),
                   "mean": sum(per.get(name, [])) / max(len(per.get(name, [])), 1),
                   "trajectories": float(len(per.get(name, [])))}
            for name, (prefix, total) in sums.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("credit_check", type=Path, help="a credit check's credit_check.json")
    args = parser.parse_args(argv)
    data = json.loads(args.credit_check.read_text(encoding="utf-8"))
    trajectories = data["trajectories"]
    table = shares(trajectories)
    counted = int(table.get("tokens", {}).get("trajectories", 0))
    print(f"{counted} of {len(trajectories)} trajectories contain a number; share of sum |A_t| "
          "on the decisive prefix (tokens up to the end of the first number):\n")
    print("| signal | pooled | mean per trajectory |\n|---|---|---|")
    for name, row in table.items():
        label = "policy tokens (uniform credit)" if name == "tokens" else name
        print(f"| {label} | {row['pooled']:.3f} | {row['mean']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
