"""Timing two or more engines on the same work, shared by the rollout benchmarks: each engine
runs once per repeat, the order alternating between repeats (so neither always runs on a cache
the other warmed), and the first repeat of each is a warm-up that is not counted."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable


def alternate(engines: dict[str, Callable[[int], dict[str, float]]], repeats: int
              ) -> dict[str, dict[str, float]]:
    """Run every engine ``repeats + 1`` times (``engines[name](repeat)`` returns one record of
    numbers), print each record to stderr, and return each engine's median of every key over
    the counted repeats (1 to ``repeats``)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for repeat in range(repeats + 1):
        order = list(engines) if repeat % 2 == 0 else list(engines)[::-1]
        for name in order:
            record = engines[name](repeat)
            if repeat:  # the first repeat warms every engine up
                results[name].append(record)
            print(f"repeat {repeat} {name}: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in record.items()), file=sys.stderr, flush=True)
    return {name: {k: statistics.median(r[k] for r in records) for k in records[0]}
            for name, records in results.items()}
