"""Peak memory and time of the trainer's update with and without layer checkpointing (issue 15).

    python benchmarks/update_memory.py [--task tool-math] [--estimator gear] [--threads 2]
        [--compare checkpoint|trims] [--rounds 1] [key=value ...]

One rollout of ``gear-rl train task=TASK`` with the task's documented settings (tool-math: 4 x 8
at ``rollout.temperature=0.7``, the benchmarks' ``TASK_SETTINGS``) is sampled once in a
subprocess and saved; then, each in a fresh subprocess of its own (so that neither inherits the
other's heap), a trainer built the same way scores that same batch, computes its credit and runs
one update with ``loss.checkpoint_layers=false`` and ``=true``. Each worker reports:

- ``update_peak_gb``: the process's peak resident set during the update (``/proc/self/
  clear_refs`` <- 5 resets the kernel's high-water mark just before it; ``VmHWM`` after), which
  includes the model, its sampler copy, the optimiser state created by the first step, the
  gradients and the activations: what the update phase of a run holds at its worst;
- ``build_and_score_peak_gb``: the worker's peak before the update (building the trainer,
  the scoring pass);
- ``second_update_peak_gb``: the same for a second update right after (the state of a later
  step: the optimiser's moments, created by the first step, are live throughout; the heap's
  free pages are handed back before it, as the trainer does between phases);
- ``update_cpu_s``: CPU seconds of the (first) update (this process; both threads);
  ``second_update_cpu_s`` the same for the second.

``--compare trims`` compares, with the task's own ``loss.checkpoint_layers``, the update
without and with the heap trims every few decoder layers (``runtime.heap_trims``, what the
trainer does where ``heap_reuse`` is off); the "off" arm forces ``runtime.heap_reuse`` to True
after building, which only skips the trims (the heap keeps glibc's default settings). With
``--rounds N`` each arm runs N times, the order alternating per round, and the medians print.

The learning rate is 1e-12, so the weights stay put. The printed ratios are on / off in the same
run. glibc keeps freed heap for reuse, so ``after_gb`` (resident after the update) is shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import reset_peak, status_bytes
from step_overhead import TASK_SETTINGS


def _memory() -> tuple[float, float]:
    """(VmHWM, VmRSS) of this process in GB."""
    return status_bytes("VmHWM") / 1e9, status_bytes("VmRSS") / 1e9


def _trainer(overrides: list[str]):
    from gear_rl.train import Trainer, load_config

    return Trainer(load_config(None, overrides))


def _rollout(overrides: list[str], path: str) -> None:
    trainer = _trainer(overrides)
    try:
        batch = trainer.rollout(1)
    finally:
        trainer.close()
    with open(path, "wb") as file:
        pickle.dump(batch, file)
    lengths = [len(r) for r in batch.response_ids]
    print(json.dumps({"rows": len(lengths), "response_tokens_mean": sum(lengths) / len(lengths),
                      "response_tokens_max": max(lengths),
                      "prompt_tokens": sorted({len(p) for p in batch.prompt_ids})}))


def _update(overrides: list[str], path: str, trims: bool = True) -> None:
    from gear_rl.train.memory import release_free_memory

    trainer = _trainer(overrides)
    if not trims:
        trainer.runtime.heap_reuse = True  # skips the update's heap trims, nothing else
    try:
        with open(path, "rb") as file:
            batch = pickle.load(file)
        fusion = trainer.engine.fusion(batch)
        scores = trainer.score(batch, fusion)
        credit = trainer.credit_for_update(batch, scores, 1)
        build_peak = _memory()[0]
        reset_peak()
        before = _memory()[1]
        cpu, wall = time.process_time(), time.perf_counter()
        trainer.update(batch, scores, credit, 1)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        peak, after = _memory()
        # a later step's update: the optimiser state (created by the first step) is live
        # throughout; the trainer frees the heap's free pages between phases
        release_free_memory()
        reset_peak()
        steady_before = _memory()[1]
        steady_cpu = time.process_time()
        trainer.update(batch, scores, trainer.credit_for_update(batch, scores, 2), 2)
        steady_cpu = time.process_time() - steady_cpu
        steady_peak = _memory()[0]
        micro = trainer.engine.micro_batches(batch, list(range(len(batch.response_ids))))
        print(json.dumps({
            "checkpoint_layers": trainer.engine.signals.checkpoint_layers,
            "fused": None if fusion is None else fusion.value,
            "micro_batches": len(micro), "before_gb": round(before, 3),
            "update_peak_gb": round(peak, 3), "after_gb": round(after, 3),
            "update_cpu_s": round(cpu, 2), "update_wall_s": round(wall, 2),
            "build_and_score_peak_gb": round(build_peak, 3),
            "second_before_gb": round(steady_before, 3),
            "second_update_peak_gb": round(steady_peak, 3),
            "second_update_cpu_s": round(steady_cpu, 2)}))
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="tool-math")
    parser.add_argument("--estimator", default="gear")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", choices=["checkpoint", "trims"], default="checkpoint")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--worker", choices=["rollout", "update", "update-no-trims"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value, as for gear-rl train")
    args = parser.parse_args()
    if args.worker is not None:
        if args.worker == "rollout":
            _rollout(args.overrides, args.batch)
        else:
            _update(args.overrides, args.batch, trims=args.worker == "update")
        return
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="gear-rl-update-memory-") as scratch:
        batch = os.path.join(scratch, "batch.pkl")
        base = [f"task={args.task}", f"estimator={args.estimator}", f"threads={args.threads}",
                *TASK_SETTINGS.get(args.task, ()), "optim.lr=1e-12", "eval.at_start=false",
                "log.progress=false", "log.report_to=none", *args.overrides]

        def worker(kind: str, extra: list[str]) -> dict:
            out = os.path.join(scratch, f"run-{kind}-{len(os.listdir(scratch))}")
            command = [sys.executable, os.path.abspath(__file__), "--worker", kind,
                       "--batch", batch, *base, f"out={out}", *extra]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{kind} worker failed:\n{done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        shape = worker("rollout", [])
        print(f"rollout: {shape}", flush=True)
        if args.compare == "checkpoint":
            arms = {"false": ("update", ["loss.checkpoint_layers=false"]),
                    "true": ("update", ["loss.checkpoint_layers=true"])}
        else:
            arms = {"false": ("update-no-trims", []), "true": ("update", [])}
        runs: dict[str, list[dict]] = {"false": [], "true": []}
        for round_ in range(args.rounds):
            for value in (("false", "true") if round_ % 2 == 0 else ("true", "false")):
                kind, extra = arms[value]
                runs[value].append(worker(kind, extra))
                print(f"{args.compare}={value} (round {round_ + 1}): {runs[value][-1]}",
                      flush=True)
    results = {value: {key: (statistics.median(run[key] for run in done)
                             if isinstance(done[0][key], (int, float))
                             and not isinstance(done[0][key], bool) else done[0][key])
                       for key in done[0]}
               for value, done in runs.items()}
    off, on = results["false"], results["true"]
    print(f"\n{'':24}{'off':>10}{'on':>10}{'on/off':>10}")
    for key in ("update_peak_gb", "after_gb", "second_update_peak_gb", "update_cpu_s",
                "update_wall_s", "second_update_cpu_s"):
        print(f"{key:24}{off[key]:>10}{on[key]:>10}{on[key] / off[key]:>10.3f}")
    print(json.dumps({"task": args.task, "estimator": args.estimator, "compare": args.compare,
                      "rounds": args.rounds, "rollout": shape,
                      "off": off, "on": on,
                      "peak_ratio": round(on["update_peak_gb"] / off["update_peak_gb"], 3),
                      "second_peak_ratio": round(on["second_update_peak_gb"]
                                                 / off["second_update_peak_gb"], 3),
                      "cpu_ratio": round(on["update_cpu_s"] / off["update_cpu_s"], 3)}))


if __name__ == "__main__":
    main()
