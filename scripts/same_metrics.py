"""Do two runs log the same numbers? Compares two ``metrics.jsonl`` files record by record,
every key except timings (``time/*``), memory (``memory/*``), hardware utilisation
(``perf/*``) and ``rollout_tok_per_s``, with
exact equality: what a refactor that keeps behaviour must show on the same seed and machine.

Run:  python scripts/same_metrics.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl
Exits 1 and lists the differences when any value or key differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SKIPPED = ("time/", "memory/", "perf/", "rollout_tok_per_s")


def _records(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    first, second = _records(args[0]), _records(args[1])
    problems, equal = [], 0
    if len(first) != len(second):
        problems.append(f"{len(first)} records against {len(second)}")
    for a, b in zip(first, second, strict=False):
        keys = {k for k in (*a, *b) if not k.startswith(SKIPPED)}
        for key in sorted(keys):
            if a.get(key) != b.get(key):
                problems.append(f"step {a.get('step')}: {key}: {a.get(key)!r} != {b.get(key)!r}")
            else:
                equal += 1
    for line in problems:
        print(line)
    print(f"{min(len(first), len(second))} records, {equal} equal values, "
          f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
