"""Peak memory and time of the trainer's update with and without layer checkpointing (issue 15).

    python benchmarks/update_memory.py [--task tool-math] [--estimator gear] [--threads 2]
        [key=value ...]

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
- ``update_cpu_s``: CPU seconds of the (first) update (this process; both threads).

The learning rate is 1e-12, so the weights stay put. The printed ratios are on / off in the same
run. glibc keeps freed heap for reuse, so ``after_gb`` (resident after the update) is shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
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


def _update(overrides: list[str], path: str) -> None:
    from gear_rl.train.runtime import release_free_memory

    trainer = _trainer(overrides)
    try:
        with open(path, "rb") as file:
            batch = pickle.load(file)
        fused = trainer._fused_mode(batch)
        scores = trainer.score(batch, student=fused is None)
        advantages = None if fused == "inline" else trainer.credit(batch, scores, 1)
        build_peak = _memory()[0]
        reset_peak()
        before = _memory()[1]
        cpu, wall = time.process_time(), time.perf_counter()
        trainer.update(batch, scores, advantages, 1, fused=fused)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        peak, after = _memory()
        # a later step's update: the optimiser state (created by the first step) is live
        # throughout; the trainer frees the heap's free pages between phases
        release_free_memory()
        reset_peak()
        steady_before = _memory()[1]
        trainer.update(batch, scores, advantages, 2, fused=fused)
        steady_peak = _memory()[0]
        micro = trainer._micro_batches(batch, list(range(len(batch.response_ids))))
        print(json.dumps({
            "checkpoint_layers": trainer.checkpoint_layers, "fused": fused,
            "micro_batches": len(micro), "before_gb": round(before, 3),
            "update_peak_gb": round(peak, 3), "after_gb": round(after, 3),
            "update_cpu_s": round(cpu, 2), "update_wall_s": round(wall, 2),
            "build_and_score_peak_gb": round(build_peak, 3),
            "second_before_gb": round(steady_before, 3),
            "second_update_peak_gb": round(steady_peak, 3)}))
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="tool-math")
    parser.add_argument("--estimator", default="gear")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=["rollout", "update"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value, as for gear-rl train")
    args = parser.parse_args()
    if args.worker is not None:
        (_rollout if args.worker == "rollout" else _update)(args.overrides, args.batch)
        return
    with tempfile.TemporaryDirectory(prefix="gear-rl-update-memory-") as scratch:
        batch = os.path.join(scratch, "batch.pkl")
        base = [f"task={args.task}", f"estimator={args.estimator}", f"threads={args.threads}",
                *TASK_SETTINGS.get(args.task, ()), "optim.lr=1e-12", "eval.at_start=false",
                "log.progress=false", "log.tensorboard=false", *args.overrides]

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
        results = {}
        for value in ("false", "true"):
            results[value] = worker("update", [f"loss.checkpoint_layers={value}"])
            print(f"checkpoint_layers={value}: {results[value]}", flush=True)
    off, on = results["false"], results["true"]
    print(f"\n{'':24}{'off':>10}{'on':>10}{'on/off':>10}")
    for key in ("update_peak_gb", "after_gb", "second_update_peak_gb", "update_cpu_s",
                "update_wall_s"):
        print(f"{key:24}{off[key]:>10}{on[key]:>10}{on[key] / off[key]:>10.3f}")
    print(json.dumps({"task": args.task, "estimator": args.estimator, "rollout": shape,
                      "off": off, "on": on,
                      "peak_ratio": round(on["update_peak_gb"] / off["update_peak_gb"], 3),
                      "second_peak_ratio": round(on["second_update_peak_gb"]
                                                 / off["second_update_peak_gb"], 3),
                      "cpu_ratio": round(on["update_cpu_s"] / off["update_cpu_s"], 3)}))


if __name__ == "__main__":
    main()
