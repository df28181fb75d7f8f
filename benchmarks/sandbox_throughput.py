"""Executions per second of short snippets: the warm ``PythonSandbox`` pool against starting a
fresh ``python -c`` subprocess per call (no isolation at all), same snippets, same parallelism,
same run. Goal (issue 5): the pool at least 5x faster.

    python benchmarks/sandbox_throughput.py            # 400 snippets, 2 workers
    python benchmarks/sandbox_throughput.py --quick    # 60 snippets

The pool does strictly more work per call than the baseline (namespaces were set up once, but
every call still forks, drops privileges, applies limits, and cleans up); what it saves is the
interpreter start-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from gear_rl.agent.tools import PythonSandbox

SNIPPETS = (
    "print(sum(i * i for i in range(1000)))",
    "import math\nprint(math.comb(30, 12))",
    "x = [3, 1, 2]\nx.sort()\nprint(x)",
    "print(' '.join(str(n) for n in range(20)))",
)


def fresh_subprocess(code: str, timeout_s: float) -> bool:
    """One call of the baseline: a new interpreter per snippet."""
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=timeout_s, check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
    )
    return completed.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 snippets instead of 400")
    parser.add_argument("--n", type=int, default=None, help="number of snippets")
    parser.add_argument("--workers", type=int, default=2, help="pool size = baseline threads")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed rounds")
    args = parser.parse_args()
    n = args.n or (60 if args.quick else 400)
    codes = [SNIPPETS[i % len(SNIPPETS)] for i in range(n)]

    started = time.perf_counter()
    sandbox = PythonSandbox(workers=args.workers, timeout_s=10.0, memory_mb=512)
    start_s = time.perf_counter() - started
    with sandbox:
        assert all(r.ok for r in sandbox.run_many(codes[: 2 * args.workers])), "warm-up failed"
        pool_rates, fresh_rates = [], []
        for _ in range(args.repeats):  # alternate so both see the same machine load
            t0 = time.perf_counter()
            results = sandbox.run_many(codes)
            pool_rates.append(n / (time.perf_counter() - t0))
            assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.workers) as threads:
                ok = list(threads.map(lambda c: fresh_subprocess(c, 30.0), codes))
            fresh_rates.append(n / (time.perf_counter() - t0))
            assert all(ok), "baseline snippet failed"
        durations = [r.duration_s for r in results]
    pool = statistics.median(pool_rates)
    fresh = statistics.median(fresh_rates)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"isolation mode: {sandbox.isolation.get('mode')}, pool start-up {start_s:.2f} s")
    print(f"{n} snippets x {args.repeats} rounds, parallelism {args.workers}")
    print(f"warm pool      : {pool:8.1f} exec/s  (rounds: "
          f"{', '.join(f'{r:.1f}' for r in pool_rates)}; median in-worker time "
          f"{statistics.median(durations) * 1000:.1f} ms)")
    print(f"fresh python -c: {fresh:8.1f} exec/s  (rounds: "
          f"{', '.join(f'{r:.1f}' for r in fresh_rates)})")
    print(f"ratio          : {pool / fresh:8.2f}x  (goal >= 5x)")


if __name__ == "__main__":
    main()
