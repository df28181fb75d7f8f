"""What the trainer's Monte-Carlo values phase costs (issue 39): its share of a training step and
its length against the rollout's, for SPO-chain and VinePPO at the authors' K (9), on the
default task, on grpo_weak's task (three one-digit factors, work shown, 96 new tokens) and on
the answer-first task (one-digit products scored on the response's first number, 64 new tokens).

Each (task, estimator) runs ``--steps`` training steps of the bundled SmolLM2-135M in this
process, one after another (never in parallel), after one warm-up step; per step it reads the
step's record: ``time/values``, ``time/rollout``, ``time/step``, ``mc/tokens`` (continuation
tokens sampled) and ``mc/boundaries_per_response``. Prints the medians, the phase's share of
the step, its time over the rollout's, its tokens per second and the continuation tokens per
rollout token (what equal-token GRPO must be given: docs/results.md, the control study), and
one JSON line. The values phase's throughput against per-cut ``model.generate`` is
``benchmarks/credit_check_speed.py --samples 9`` (the phase runs the credit check's estimator).

Tool-math (and every agent or environment task) is refused by the trainer for these
estimators: the values phase continues single responses only.

Run:  python benchmarks/values_phase.py [--steps 2] [--warmup 1] [--estimators spo_chain,vineppo]
      [--tasks default,products_work,products_first]
On a shared CPU, run it when the machine is quiet: it measures wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gear_rl.rundir import cpu_model
from gear_rl.train import Trainer, load_config

TASKS = {
    "default": [],
    "products_work": ["task_options.min_terms=3", "task_options.max_terms=3",
                      "rollout.max_new_tokens=96",
                      "instruction= Show your work step by step, then give the final answer."],
    # issue 39 step 5: the outcome is decided by the first number; the rest cannot change it
    "products_first": ["task_options.answer_rule=first_number", "rollout.max_new_tokens=64",
                       "instruction= Give the answer first, then explain your reasoning."],
}


def _run(task: str, estimator: str, steps: int, warmup: int,
         extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        config = load_config(None, [f"estimator={estimator}", f"out={out}", "eval.at_start=false",
                                    "log.progress=false", "log.report_to=none",
                                    "log.samples_per_step=0", "log.checkpoint_every=0",
                                    f"steps={steps + warmup}", *TASKS[task], *extra])
        trainer = Trainer(config)
        try:
            records = [trainer.step(step)[0] for step in range(1, steps + warmup + 1)][warmup:]
        finally:
            trainer.close()
    med = {key: statistics.median(r.get(key, 0.0) for r in records)
           for key in ("time/values", "time/rollout", "time/step", "mc/tokens",
                       "mc/boundaries_per_response", "response_len")}
    rollout_tokens = med["response_len"] * config.rollout.prompts_per_step * (
        config.rollout.samples_per_prompt)
    return {**med, "share_of_step": med["time/values"] / med["time/step"],
            "values_over_rollout": med["time/values"] / med["time/rollout"],
            "values_tok_per_s": med["mc/tokens"] / max(med["time/values"], 1e-9),
            "continuation_tokens_per_rollout_token": med["mc/tokens"] / max(rollout_tokens, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--estimators", default="spo_chain,vineppo")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (all runs)")
    args = parser.parse_args(argv)
    rows = {}
    for task in args.tasks.split(","):
        for estimator in args.estimators.split(","):
            rows[f"{task}/{estimator}"] = _run(task, estimator, args.steps, args.warmup,
                                               args.overrides)
            row = rows[f"{task}/{estimator}"]
            print(f"{task:14s} {estimator:10s} values {row['time/values']:6.2f} s, rollout "
                  f"{row['time/rollout']:5.2f} s, step {row['time/step']:6.2f} s: "
                  f"{row['share_of_step']:.0%} of the step, {row['values_over_rollout']:.1f}x "
                  f"the rollout; {row['mc/tokens']:.0f} continuation tokens "
                  f"({row['continuation_tokens_per_rollout_token']:.1f} per rollout token), "
                  f"{row['values_tok_per_s']:.0f} tok/s, "
                  f"{row['mc/boundaries_per_response']:.1f} boundaries/response", flush=True)
    print(json.dumps({"machine": cpu_model(), "steps": args.steps, "warmup": args.warmup,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
