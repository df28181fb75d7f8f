"""The trainer's scoring + update with and without ``heap_reuse`` (glibc keeps freed blocks for
reuse within a phase; ``gear_rl.train.memory.keep_heap_pages``).

    python benchmarks/heap_reuse.py [--estimators gear,grpo] [--updates 5] [--rounds 2]
        [key=value ...]

One rollout of ``gear-rl train`` (default task, 4 x 8, the given overrides) is sampled once in a
subprocess and saved. Then, per round and estimator, two fresh subprocesses (``heap_reuse=false``
first in even rounds, ``true`` first in odd ones), each building the trainer the same way and
running the step's scoring + update on that batch ``--updates`` times after one warm-up
(learning rate 1e-12, so the weights stay put). ``mallopt`` is process-wide and cannot be
undone, hence a process per setting. Each worker reports, per update: wall seconds, user and
system CPU seconds and minor page faults (``getrusage``). Printed: the medians over all counted
updates, and on / off ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from update_memory import _rollout, _trainer  # the same trainer build and saved rollout


def _updates(overrides: list[str], path: str, updates: int) -> None:
    trainer = _trainer(overrides)
    try:
        with open(path, "rb") as file:
            batch = pickle.load(file)
        fusion = trainer.engine.fusion(batch)
        rows = []
        for step in range(1, updates + 2):
            before = resource.getrusage(resource.RUSAGE_SELF)
            wall = time.perf_counter()
            scores = trainer.score(batch, fusion)
            trainer.update(batch, scores, trainer.credit_for_update(batch, scores, step), step)
            after = resource.getrusage(resource.RUSAGE_SELF)
            if step > 1:  # the first is the warm-up
                rows.append({"wall_s": time.perf_counter() - wall,
                             "user_s": after.ru_utime - before.ru_utime,
                             "sys_s": after.ru_stime - before.ru_stime,
                             "faults": after.ru_minflt - before.ru_minflt})
        print(json.dumps(rows))
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimators", default="gear,grpo")
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=["rollout", "updates"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value, as for gear-rl train")
    args = parser.parse_args()
    if args.updates < 1 or args.rounds < 1:
        parser.error("--updates and --rounds must be >= 1")
    if args.worker == "rollout":
        _rollout(args.overrides, args.batch)
        return
    if args.worker == "updates":
        _updates(args.overrides, args.batch, args.updates)
        return
    estimators = [name.strip() for name in args.estimators.split(",") if name.strip()]
    with tempfile.TemporaryDirectory(prefix="gear-rl-heap-reuse-") as scratch:
        batch = os.path.join(scratch, "batch.pkl")
        base = [f"threads={args.threads}", "optim.lr=1e-12", "eval.at_start=false",
                "log.progress=false", "log.report_to=none", *args.overrides]

        def worker(kind: str, extra: list[str]) -> object:
            out = os.path.join(scratch, f"run-{len(os.listdir(scratch))}")
            command = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--batch",
                       batch, "--updates", str(args.updates), *base, f"out={out}", *extra]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{kind} worker failed:\n{done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        print(f"rollout: {worker('rollout', [])}", flush=True)
        results: dict[tuple[str, str], list[dict]] = {}
        for round_ in range(args.rounds):
            for estimator in estimators:
                order = ("false", "true") if round_ % 2 == 0 else ("true", "false")
                for value in order:
                    rows = worker("updates", [f"estimator={estimator}", f"heap_reuse={value}"])
                    results.setdefault((estimator, value), []).extend(rows)  # type: ignore[arg-type]
                    print(f"round {round_} {estimator} heap_reuse={value}: "
                          + ", ".join(f"{r['wall_s']:.2f}s/{r['faults']}" for r in rows),
                          flush=True)
    keys = ("wall_s", "user_s", "sys_s", "faults")
    medians = {k: {key: statistics.median(r[key] for r in rows) for key in keys}
               for k, rows in results.items()}
    print(f"\n{'':22}" + "".join(f"{key:>12}" for key in keys))
    for (estimator, value), row in sorted(medians.items()):
        print(f"{estimator + ' reuse=' + value:22}"
              + "".join(f"{row[key]:>12.2f}" if key != "faults" else f"{row[key]:>12.0f}"
                        for key in keys))
    summary: dict[str, float] = {}
    for estimator in estimators:
        on, off = medians[(estimator, "true")], medians[(estimator, "false")]
        summary[f"{estimator}_wall_on_over_off"] = round(on["wall_s"] / off["wall_s"], 3)
        summary[f"{estimator}_cpu_on_over_off"] = round(
            (on["user_s"] + on["sys_s"]) / (off["user_s"] + off["sys_s"]), 3)
        print(f"{estimator}: wall on/off {summary[f'{estimator}_wall_on_over_off']:.3f}, "
              f"CPU on/off {summary[f'{estimator}_cpu_on_over_off']:.3f}")
    if "gear" in estimators and "grpo" in estimators:
        for value in ("false", "true"):
            ratio = medians[("gear", value)]["wall_s"] / medians[("grpo", value)]["wall_s"]
            summary[f"gear_over_grpo_reuse_{value}"] = round(ratio, 3)
            print(f"GEAR / GRPO (scoring + update wall), heap_reuse={value}: {ratio:.3f}")
    print(json.dumps({"medians": {f"{e}/{v}": m for (e, v), m in medians.items()},
                      **summary}))


if __name__ == "__main__":
    main()
