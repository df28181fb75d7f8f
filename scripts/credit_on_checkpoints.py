"""Each method's credit on its own trained policy: one table from several credit checks
(issue 39, step 4; the checks are pre-registered in ``studies/credit_control.yaml``).

    python scripts/credit_on_checkpoints.py DIR [DIR ...] [--estimators grpo,spo_chain,...]

Each ``DIR`` is a credit check's output folder (``gear-rl credit-check model=CELL/policy ...
out=DIR``) named ``METHOD-sSEED`` after the study cell whose final policy it checked. Prints, per
check, the within-trajectory Spearman of each listed estimator's credit with the Monte-Carlo
truth (first replicate, 95% interval over prompt groups) and the noise ceiling (the second
replicate against the first); the cell's own method is in bold. ``gear_mp`` trains with GEAR's
weights rescaled per trajectory (``credit.mean_preserving``), which changes neither their ranks
within a trajectory nor their shares of it: its own reading is the ``gear`` row. The checks of
one table are read alike: they must share the settings that decide what is scored and how
(:data:`SHARED`: the pre-registered groups, trajectories, continuations, replicates, seed,
boundaries, and the intervals' confidence and bootstrap), which are printed under the table; a
check run otherwise is refused, naming it and the setting. Needs no model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT = ("grpo", "spo_chain", "vineppo", "gear")
OWN = {"gear_mp": "gear", "grpo_tokens": "grpo"}  # a study method -> the row that is its credit
SHARED = ("groups", "per_group", "trajectories", "continuations", "replicates", "seed",
          "boundaries", "every", "confidence", "bootstrap")
"""A credit check's settings (``credit_check.json``'s ``settings``) that the checks of one table
share."""


def shared_settings(settings: dict[Path, dict]) -> dict:
    """The :data:`SHARED` settings of every check (folder -> its ``settings``).

    Raises:
        ValueError: the checks differ in one, or a check does not record it.
    """
    first, values = next(iter(settings)), {}
    for key in SHARED:
        seen = {folder: check.get(key, "not recorded") for folder, check in settings.items()}
        if len({json.dumps(v) for v in seen.values()}) > 1 or "not recorded" in seen.values():
            raise ValueError(f"the checks are not read alike: {key} is "
                             + ", ".join(f"{v!r} in {f}" for f, v in seen.items())
                             + "; a table compares checks run with the same settings")
        values[key] = seen[first]
    return values


def _interval(score: dict | None) -> str:
    if not score or score.get("value") is None:
        return "—"
    if score.get("low") is None or score.get("high") is None:  # one prompt group: no interval
        return f"{score['value']:+.2f} (no interval, {score.get('groups')} group)"
    return f"{score['value']:+.2f} [{score['low']:+.2f}, {score['high']:+.2f}]"


def table(folders: list[Path], estimators: tuple[str, ...] = DEFAULT) -> list[str]:
    """The markdown lines of the table (header, then one line per check)."""
    lines = ["| policy (cell) | trajectories (groups) | noise ceiling | "
             + " | ".join(estimators) + " |", "|---|---|---|" + "---|" * len(estimators)]
    checks = {folder: json.loads((folder / "credit_check.json").read_text(encoding="utf-8"))
              for folder in folders}
    settings = shared_settings({folder: data.get("settings", {})
                                for folder, data in checks.items()})
    for folder, data in checks.items():
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
    shared = ", ".join(f"{key}={value}" for key, value in settings.items())
    return [*lines, "", f"Every check: {shared} ({settings['confidence'] * 100:g}% intervals "
            "over prompt groups)."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="credit-check output folders")
    parser.add_argument("--estimators", default=",".join(DEFAULT),
                        help="the estimators' rows to show, comma-separated")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not (f / "credit_check.json").is_file()]
    if missing:
        parser.error("no credit_check.json in " + ", ".join(missing))
    try:
        print("\n".join(table(args.folders, tuple(args.estimators.split(",")))))
    except ValueError as error:
        print(f"credit_on_checkpoints: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
