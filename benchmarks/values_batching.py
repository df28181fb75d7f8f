"""What the Monte-Carlo values phase's sampler buys (issue 39): :func:`gear_rl.mc_values.
estimate_values` on one step's trajectories of the bundled SmolLM2-135M, against per-cut
``model.generate`` and against the same estimator called one trajectory at a time (what the
trainer's values phase did before: each trajectory's cuts in their own decoding batches).

One training batch is rolled out and scored by the trainer (``estimator=spo_chain`` or
``vineppo``; the default task, or grpo_weak's task with ``--task products_work``), its
boundaries taken from the estimator; then, on those trajectories, each method runs
``--repeats`` times, the methods alternating:

- ``per_cut_generate``: the baseline, ``model.generate(prefix, num_return_sequences=K,
  do_sample=True, max_new_tokens=budget)`` for every open boundary of every trajectory, each
  prefix prefilled on its own (what a Monte-Carlo values phase costs without this sampler);
- ``per_trajectory``: ``estimate_values`` on each trajectory alone (all its cuts in one
  decoding batch, one prefill of its sequence), without deduplication;
- ``batched_<R>_no_dedupe``: ``estimate_values`` on all trajectories at once, ``R``
  continuation rows per decoding batch (``rollout.mc_batch_size``, its default), every
  trajectory's boundaries estimated on their own;
- ``batched_<R>``: the same, identical prefixes of several trajectories (a group's prompt, a
  shared first segment) sampled once (``dedupe_prefixes``, the authors' rule and the
  default), for each ``R`` in ``--rows``.

Each run samples ``mc_samples`` continuations per open boundary with its own seed. Prints the
median seconds, continuation tokens per second and the ratio of ``per_cut_generate``'s median
time to each method's, and one JSON line. The phase is 80-94% of an SPO-chain or VinePPO step
(``benchmarks/values_phase.py``), so its ratio is close to the step's.

Run:  python benchmarks/values_batching.py [--estimator spo_chain] [--task default]
      [--rows 128,256,512] [--repeats 2]
On a shared CPU, run it when the machine is quiet: it measures wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from gear_rl.mc_values import Trajectory, estimate_values
from gear_rl.rundir import cpu_model
from gear_rl.train import Trainer, load_config
from gear_rl.train.episodes import task_reward_fn
from values_phase import TASKS  # the same two tasks (benchmarks/ is on the path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimator", default="spo_chain", choices=["spo_chain", "vineppo"])
    parser.add_argument("--task", default="default", choices=sorted(TASKS))
    parser.add_argument("--rows", default="128,256,512",
                        help="comma-separated rows per decoding batch of the batched runs")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        config = load_config(None, [f"estimator={args.estimator}", f"out={out}",
                                    "eval.at_start=false", "log.progress=false",
                                    "log.report_to=none", *TASKS[args.task]])
        trainer = Trainer(config)
        try:
            batch = trainer.rollout(1)
            scores = trainer.score(batch)
            texts = [[trainer.tokenizer.decode([t], skip_special_tokens=True) for t in row]
                     for row in batch.response_ids]
            batch.extras = {**(batch.extras or {}), "token_texts": texts}
            mc_boundaries = trainer.estimator.mc_boundaries
            assert mc_boundaries is not None
            bounds = mc_boundaries(scores.credit_batch(batch), trainer.credit_config)
            items = [Trajectory(batch.prompt_ids[r], batch.response_ids[r], batch.finished[r],
                                bounds[r], task_reward_fn(trainer.task, batch.problems[r],
                                                          trainer.tokenizer))
                     for r in range(len(bounds)) if bounds[r]]
            rollout = config.rollout
            settings = dict(samples=trainer.credit_config.mc_samples,
                            max_new_tokens=rollout.max_new_tokens, stop_ids=trainer.stop_ids,
                            pad_id=trainer.pad_id, temperature=rollout.temperature,
                            top_p=rollout.top_p)

            def per_trajectory(seed: int) -> int:
                return sum(estimate_values(trainer.sampler, [item], seeds=(seed,),
                                           dedupe=False, **settings)[0].tokens
                           for item in items)

            def batched(rows: int, dedupe: bool = True):
                def run(seed: int) -> int:
                    return sum(v.tokens for v in estimate_values(
                        trainer.sampler, items, seeds=(seed,), batch_size=rows, dedupe=dedupe,
                        **settings))
                return run

            stop_set = set(trainer.stop_ids)

            @torch.no_grad()
            def per_cut_generate(seed: int) -> int:
                torch.manual_seed(seed)
                total = 0
                for item in items:
                    prefix = [*item.prompt_ids, *item.response_ids]
                    for b in item.boundaries:
                        budget = rollout.max_new_tokens - b
                        if b == len(item.response_ids) or budget < 1:
                            continue  # terminal: nothing to sample
                        cut = len(item.prompt_ids) + b
                        inputs = torch.tensor([prefix[:cut]])
                        out = trainer.sampler.generate(
                            input_ids=inputs, attention_mask=torch.ones_like(inputs),
                            do_sample=True, num_return_sequences=settings["samples"],
                            max_new_tokens=budget, temperature=rollout.temperature,
                            top_p=rollout.top_p, top_k=0, eos_token_id=trainer.stop_ids,
                            pad_token_id=trainer.pad_id)
                        for row in out[:, cut:].tolist():
                            kept = next((i + 1 for i, t in enumerate(row) if t in stop_set),
                                        len(row))
                            total += kept
                return total

            methods = {"per_cut_generate": per_cut_generate,
                       "per_trajectory": per_trajectory,
                       f"batched_{rollout.mc_batch_size}_no_dedupe":
                           batched(rollout.mc_batch_size, dedupe=False)}
            methods.update({f"batched_{r}": batched(int(r)) for r in args.rows.split(",")})
            seconds: dict[str, list[float]] = {name: [] for name in methods}
            tokens: dict[str, list[int]] = {name: [] for name in methods}
            for repeat in range(args.repeats):
                for name, run in methods.items():
                    started = time.perf_counter()
                    tokens[name].append(run(1000 + repeat))
                    seconds[name].append(time.perf_counter() - started)
                    print(f"  repeat {repeat}: {name:16s} {seconds[name][-1]:7.2f} s, "
                          f"{tokens[name][-1]} tokens", file=sys.stderr, flush=True)
        finally:
            trainer.close()
    base = statistics.median(seconds["per_cut_generate"])
    rows = {}
    opened = sum(len(item.boundaries) for item in items)
    print(f"{args.task} / {args.estimator}: {len(items)} trajectories, {opened} boundaries, "
          f"{trainer.credit_config.mc_samples} continuations each ({cpu_model()})")
    for name in methods:
        med = statistics.median(seconds[name])
        rate = statistics.median(t / s for t, s in zip(tokens[name], seconds[name],
                                                         strict=True))
        rows[name] = {"seconds": med, "tok_per_s": rate, "speedup": base / med}
        print(f"{name:24s} {med:7.2f} s  {rate:7.0f} tok/s  {base / med:5.2f}x per_cut_generate")
    print(json.dumps({"machine": cpu_model(), "task": args.task, "estimator": args.estimator,
                      "repeats": args.repeats, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
