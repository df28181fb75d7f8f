"""Multi-turn rollouts reusing each row's KV cache from one turn to the next
(``agent.reuse_kv_cache``, :class:`~gear_rl.sampling.TurnCache`), against prefilling every
turn's whole context (the sampler before it; ``agent.reuse_kv_cache=false``).

An environment episode calls the sampler once per move, each time with the episode so far as
context: the system prompt, every earlier move and every board the environment printed. Without
reuse each call prefills all of it again, so prefill grows with the square of the number of
turns; with reuse a call prefills only what it adds to a row of the previous call (that row's
last sampled token and the new observation) and reads the rest from the row's kept cache.

Model and batch as the trainer builds them (``build_runtime``), with study 4's settings
(``studies/sokoban.yaml``): SmolLM2-135M-Instruct, text Sokoban with one box and 1-3-move
levels, up to 6 moves of up to 24 tokens, its first ``rollout.prompts_per_step`` (4) levels x
``rollout.samples_per_prompt`` (8), the sampler copy in ``rollout.dtype`` (bf16 by default),
``threads`` torch threads (default 1). Both engines run ``gear_rl.train.episodes.collect`` with
the same seeds; in fp32 they sample the same episodes (``tests/test_train_agentic.py``), in bf16
the rounding of a prefill over the cached keys differs from a prefill over the whole context,
so the two draw other episodes from the same distribution and the episode statistics are
printed beside the cost. Counted with a forward hook on the sampler: prefill tokens and decoded
row-steps; timed: wall and this process's CPU seconds; and the process's peak resident memory
during the rollout (kept rows cost memory between turns). Repeats alternate the order; one
warm-up repeat of each is not counted. A ``task=`` override replaces the Sokoban settings with
that task's defaults (e.g. ``task=keydoor``, or ``task=tool-math rollout.temperature=0.7``).

Run:  python benchmarks/turn_kv_reuse.py [--repeats 3] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from _alternate import alternate
from _proc import reset_peak, status_bytes
from agent_rollout import counted_collect
from gear_rl.signals import prompt_ids
from gear_rl.train import load_config
from gear_rl.train.runtime import build_runtime, rollout_settings

SOKOBAN = ("task=sokoban", "task_options.num_boxes=1", "task_options.min_solution_length=1",
           "task_options.max_solution_length=3", "agent.max_turns=6",
           "agent.max_new_tokens_per_turn=24")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="counted repeats per engine")
    parser.add_argument("overrides", nargs="*",
                        help="key=value config overrides (after study 4's Sokoban settings; "
                             "with task=..., after that task's defaults)")
    args = parser.parse_args()
    other_task = any(o.startswith("task=") for o in args.overrides)
    config = load_config(None, [*(() if other_task else SOKOBAN), "threads=1", *args.overrides])
    runtime = build_runtime(config, training=True)
    try:
        rollout = config.rollout
        problems = [p for p in runtime.task.train[: rollout.prompts_per_step]
                    for _ in range(rollout.samples_per_prompt)]
        prompts = [prompt_ids(runtime.tokenizer, p.prompt) for p in problems]
        settings = rollout_settings(config, runtime)
        print(f"model {config.model}, {torch.get_num_threads()} threads, {len(prompts)} rows, "
              f"task {runtime.task.name}, sampler {rollout.dtype}, "
              f"limits {settings['limits']}", file=sys.stderr)

        def engine(reuse: bool):
            def run(repeat: int) -> dict[str, float]:
                reset_peak()
                rows, record = counted_collect(runtime, problems, prompts,
                                               {**settings, "reuse_cache": reuse}, repeat)
                record = {**record, "peak_rss_gb": status_bytes("VmHWM") / 1e9,
                          "response_tokens": sum(len(r) for r in rows.response_ids),
                          "reward_mean": statistics.fmean(rows.rewards)}
                for key in ("env/turns_per_episode", "env/success_rate"):
                    if key in rows.metrics:
                        record[key] = rows.metrics[key]
                return record
            return run

        median = alternate({"prefill_every_turn": engine(False),
                            "reuse_kv_cache": engine(True)}, args.repeats)
    finally:
        runtime.close()
    base, new = median["prefill_every_turn"], median["reuse_kv_cache"]
    summary = {"engines": median,
               "ratio_prefill_tokens": base["prefill_tokens"] / new["prefill_tokens"],
               "ratio_wall": base["wall_s"] / new["wall_s"],
               "ratio_cpu": base["cpu_s"] / new["cpu_s"]}
    for name, values in median.items():
        print(f"{name:18s} wall {values['wall_s']:.1f} s  cpu {values['cpu_s']:.1f} s  "
              f"peak RSS {values['peak_rss_gb']:.2f} GB  "
              f"prefill tokens {values['prefill_tokens']:.0f}  decoded row-steps "
              f"{values['decoded_row_steps']:.0f}  response tokens "
              f"{values['response_tokens']:.0f}  reward {values['reward_mean']:.3f}  turns "
              f"{values.get('env/turns_per_episode', float('nan')):.2f}")
    print(f"prefill_every_turn / reuse_kv_cache: prefill tokens "
          f"{summary['ratio_prefill_tokens']:.2f}x, wall {summary['ratio_wall']:.2f}x, "
          f"cpu {summary['ratio_cpu']:.2f}x")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
