"""Parallel cells or threads? The wall time of the same two study cells trained two ways.

- **jobs**: both cells at once, each in its own process with ``threads`` torch threads
  (default: 2 processes x 1 thread);
- **threads**: the cells one after another, each with ``jobs x threads`` threads (default: 1
  process x 2 threads).

Both go through the study runner (``gear_rl.study.run_study``: a process per cell, as a real
study runs them), on a two-seed, one-method study of the given budget, in a fresh folder each
time. The two ways alternate ``--reps`` times; the medians and their ratio are printed (ratio >
1: the parallel processes finished the pair sooner), with the peak resident memory of one cell
(``CELL_MEMORY_GB`` in ``gear_rl.study.runner`` bounds the default number of jobs by it).

Run:  python benchmarks/study_parallel.py [--reps 2] [--jobs 2] [--threads 1] [key=value ...]
(train keys for the cells; default budget: SmolLM2-135M on the default task, 2 steps,
``eval.size=16 eval.k=2``; ``model=tiny-random`` for a quick check). Prints one line per run and
a JSON summary. On a shared CPU the numbers move with the neighbours' load: compare only the
ratio within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gear_rl.dataclass_config import parse_overrides
from gear_rl.study import parse_spec, run_study
from gear_rl.study.runner import machine_info

BUDGET = {"steps": 2, "eval.size": 16, "eval.k": 2, "eval.at_start": False,
          "log.report_to": "none", "log.checkpoint_every": 0, "log.samples_per_step": 0}


def _study(overrides: dict) -> dict:
    return {"name": "parallel", "seeds": [0, 1], "budget": {**BUDGET, **overrides},
            "tasks": {"products": {}}, "methods": {"grpo": {}}, "keep_checkpoints": False}


def _run(spec, jobs: int, threads: int, root: Path, name: str) -> float:
    out = root / name
    started = time.perf_counter()
    result = run_study(spec, out, jobs=jobs, threads=threads, progress=False)
    seconds = time.perf_counter() - started
    if result.failed:
        log = result.failed[0].log
        raise SystemExit(f"{name}: a cell failed; see {log}:\n{log.read_text()[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="alternations of the two ways")
    parser.add_argument("--jobs", type=int, default=2, help="processes of the parallel way")
    parser.add_argument("--threads", type=int, default=1, help="threads per parallel process")
    parser.add_argument("overrides", nargs="*", help="train key=value for the cells")
    args = parser.parse_args()
    spec = parse_spec(_study(parse_overrides(args.overrides)))
    machine = machine_info()
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, AMX {machine['amx_bf16']}, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    times: dict[str, list[float]] = {"jobs": [], "threads": []}
    ways = {"jobs": (args.jobs, args.threads), "threads": (1, args.jobs * args.threads)}
    with tempfile.TemporaryDirectory(prefix="study_parallel-") as tmp:
        for rep in range(args.reps):
            order = ("jobs", "threads") if rep % 2 == 0 else ("threads", "jobs")
            for way in order:
                jobs, threads = ways[way]
                seconds = _run(spec, jobs, threads, Path(tmp), f"{way}-{rep}")
                times[way].append(seconds)
                print(f"rep {rep}: {way:<7} ({jobs} process(es) x {threads} thread(s)): "
                      f"{seconds:7.1f} s for 2 cells (load average {os.getloadavg()[0]:.1f})",
                      flush=True)
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    medians = {way: statistics.median(values) for way, values in times.items()}
    ratio = medians["threads"] / medians["jobs"]
    print(f"median: {args.jobs} x {args.threads}-thread processes {medians['jobs']:.1f} s, "
          f"1 x {args.jobs * args.threads}-thread process {medians['threads']:.1f} s; ratio "
          f"threads/jobs = {ratio:.2f} ({'parallel processes' if ratio > 1 else 'threads'} "
          f"faster); peak cell memory {peak_gb:.1f} GB")
    print(json.dumps({"times_s": times, "median_s": medians, "ratio_threads_over_jobs": ratio,
                      "peak_cell_rss_gb": peak_gb, "overrides": args.overrides,
                      "machine": machine}))


if __name__ == "__main__":
    sys.exit(main())
