"""Executions per second of short snippets: the warm ``PythonSandbox`` pool against starting a
fresh ``python -c`` subprocess per call (no isolation at all), same snippets, same parallelism,
same run. Goal (issue 5): the pool at least 5x faster.

    python benchmarks/sandbox_throughput.py            # 400 snippets, 2 workers
    python benchmarks/sandbox_throughput.py --quick    # 60 snippets

Where bubblewrap (``bwrap``, Debian's ``bubblewrap``) is installed, a third set-up runs too: a
fresh ``bwrap ... python -c`` per call over the same allowlisted root the pool builds
(``sandbox.root_plan``): what isolating each call with bubblewrap, without warm workers, costs
(issue 14 weighed it against the pool's own ``pivot_root``).

The pool does strictly more work per call than the baseline (namespaces were set up once, but
every call still forks, drops privileges, applies limits, and cleans up); what it saves is the
interpreter start-up.

Besides executions per second (wall clock, sensitive to what else the machine runs), it prints
the CPU time each execution costs in both set-ups (user + system, the dispatching process
included; for the pool, the workers and their reaped children read from /proc), which does not
depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def bwrap_command(plan: dict, python: str) -> list[str]:
    """bubblewrap over the pool's allowlist: the same read-only binds, empty package directories
    and links, a fresh /dev, /proc and /tmp, every namespace, no capabilities, uid 65534."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", "65534", "--gid", "65534", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
    steps = [(path, 0) for path in plan["binds"]] + [(path, 1) for path in plan["covers"]]
    for path, kind in sorted(steps, key=lambda step: (step[0].count("/"), step[1], step[0])):
        argv += ["--ro-bind", path, path] if kind == 0 else ["--tmpfs", path]
    for path, target in plan["links"].items():
        argv += ["--symlink", target, path]
    for path in plan["covers"]:  # once the binds inside them have their mount points
        argv += ["--remount-ro", path]
    return [*argv, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--chdir", "/tmp",
            python, "-I", "-c"]


def fresh_bwrap(prefix: list[str], code: str, timeout_s: float) -> bool:
    """One call of the bubblewrap set-up: a new sandbox and a new interpreter per snippet."""
    completed = subprocess.run([*prefix, code], capture_output=True, timeout=timeout_s,
                               check=False)
    return completed.returncode == 0


def _cpu_seconds(pids: list[int]) -> float:
    """user + system time of processes and of their reaped children (from /proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def _own_cpu(children: bool) -> float:
    times = os.times()
    return times.user + times.system + (
        times.children_user + times.children_system if children else 0.0)


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
    bwrap = bwrap_command(sandbox.root_plan, sys.executable) if shutil.which("bwrap") else None
    if bwrap is not None and not fresh_bwrap(bwrap, "print(1)", 30.0):
        print("bwrap is installed but could not run here; leaving it out")
        bwrap = None
    with sandbox:
        assert all(r.ok for r in sandbox.run_many(codes[: 2 * args.workers])), "warm-up failed"
        pool_rates, fresh_rates, pool_cpu, fresh_cpu, bwrap_rates = [], [], [], [], []
        pids = sandbox.worker_pids()
        for _ in range(args.repeats):  # alternate so both see the same machine load
            c0, t0 = _cpu_seconds(pids) + _own_cpu(False), time.perf_counter()
            results = sandbox.run_many(codes)
            pool_rates.append(n / (time.perf_counter() - t0))
            pool_cpu.append((_cpu_seconds(pids) + _own_cpu(False) - c0) / n)
            assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
            assert sandbox.worker_pids() == pids, "a worker was replaced during the benchmark"
            c0, t0 = _own_cpu(True), time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.workers) as threads:
                ok = list(threads.map(lambda c: fresh_subprocess(c, 30.0), codes))
            fresh_rates.append(n / (time.perf_counter() - t0))
            fresh_cpu.append((_own_cpu(True) - c0) / n)
            assert all(ok), "baseline snippet failed"
            if bwrap is not None:
                t0 = time.perf_counter()
                with ThreadPoolExecutor(max_workers=args.workers) as threads:
                    ok = list(threads.map(lambda c: fresh_bwrap(bwrap, c, 30.0), codes))
                bwrap_rates.append(n / (time.perf_counter() - t0))
                assert all(ok), "bwrap snippet failed"
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
    if bwrap_rates:
        per_call = statistics.median(bwrap_rates)
        print(f"fresh bwrap    : {per_call:8.1f} exec/s  (rounds: "
              f"{', '.join(f'{r:.1f}' for r in bwrap_rates)}; same allowlisted root per call)")
    print(f"ratio          : {pool / fresh:8.2f}x  (goal >= 5x)")
    if bwrap_rates:
        print(f"pool / bwrap   : {pool / statistics.median(bwrap_rates):8.2f}x")
    pool_ms, fresh_ms = statistics.median(pool_cpu) * 1e3, statistics.median(fresh_cpu) * 1e3
    print(f"CPU per execution: pool {pool_ms:.1f} ms, fresh python -c {fresh_ms:.1f} ms "
          f"({fresh_ms / pool_ms:.2f}x less CPU in the pool)")


if __name__ == "__main__":
    main()
