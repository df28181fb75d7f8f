"""Each method's credit on its own trained policy: one table from several credit checks
(issue 39, step 4; the checks are pre-registered in ``studies/credit_control.yaml``).

    python scripts/credit_on_checkpoints.py DIR [DIR ...] [--estimators grpo,spo_chain,...]

Each ``DIR`` is a credit check's output folder (``gear-rl credit-check model=CELL/policy ...
out=DIR``) named ``METHOD-sSEED`` after the study cell whose final policy it checked. Prints, per
check, the within-trajectory Spearman of each listed estimator's credit with the Monte-Carlo
truth (first replicate, 95% interval over prompt groups) and the noise ceiling (the second
replicate against the first); the cell's own method is in bold. ``gear_mp`` trains with GEAR's
weights rescaled per trajectory (``credit.mean_preserving``), which changes neither their ranks
within a trajectory nor their shares of it: its own reading is the ``gear`` row. Needs no model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT = ("grpo", "spo_chain", "vineppo", "gear")
OWN = {"gear_mp": "gear", "grpo_tokens": "grpo"}  # a study method -> the row that is its credit


def _interval(score: dict | None) -> str:
    if not score or score.get("value") is None:
        return "—"
    return f"{score['value']:+.2f} [{score['low']:+.2f}, {score['high']:+.2f}]"


def table(folders: list[Path], estimators: tuple[str, ...] = DEFAULT) -> list[str]:
    """The markdown lines of the table (header, then one line per check)."""
    lines = ["| policy (cell) | trajectories (groups) | noise ceiling | "
             + " | ".join(estimators) + " |", "|---|---|---|" + "---|" * len(estimators)]
    for folder in folders:
        data = json.loads((folder / "credit_check.json").read_text(encoding="utf-8"))
        scores = data["scores"]
        rows = {row["label"]: row["scores"]["first"]["spearman"] for row in scores["rows"]
                if not row.get("variant")}
        method = folder.name.rsplit("-s", 1)[0]
        own = OWN.get(method, method)
        ceiling = scores["ceiling"]["spearman"]
        cells = []
        for name in estimators:
            text = _interval(rows.get(name))
            cells.append(f"**{text}**" if name == own else text)
        lines.append(f"| {folder.name} | {ceiling['trajectories']} ({ceiling['groups']}) | "
                     f"{_interval(ceiling)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="credit-check output folders")
    parser.add_argument("--estimators", default=",".join(DEFAULT),
                        help="the estimators' rows to show, comma-separated")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not (f / "credit_check.json").is_file()]
    if missing:
        parser.error("no credit_check.json in " + ", ".join(missing))
    print("\n".join(table(args.folders, tuple(args.estimators.split(",")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
