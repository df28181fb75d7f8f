"""Multi-turn (tool-math) rollouts: the sampler stopping each row at its complete call and at
its own turn budget, against decoding every row to the batch's largest budget.

The agent loop cuts every turn just after its first complete tool call and caps it at what is
left of its budget; tokens a sampler writes beyond either are thrown away. Before, the trainer's
``generate`` decoded every row of a round up to the largest budget of the round (or its end of
turn); now ``collect`` passes each row's budget and a :class:`~gear_rl.sampling.RowStop`
that ends a row once its new tokens hold a complete call (``gear_rl.train.episodes.call_stop``).
Both run the same loop (``gear_rl.agent.run_agent`` through ``collect``'s agent path), the same
sandbox and the same seeds; which tokens are drawn differs (rows leave the batch at other steps,
so the random stream is consumed differently), so the two give other episodes from the same
distribution, and the episode statistics are printed beside the cost.

Model and batch as the trainer builds them (``build_runtime``): SmolLM2-135M-Instruct, the
default ``tool-math`` task (two-digit products, Markdown Python fences), its first
``rollout.prompts_per_step`` (4) problems x ``rollout.samples_per_prompt`` (8), at
``rollout.temperature`` 0.7 (the README's tool-math setting), ``threads`` torch threads
(default 1), the sampler copy in ``rollout.dtype``; ``--checkpoint`` loads trained weights (at
the initial weights the policy calls the tool in a few percent of turns, so there is almost
nothing to save). Counted with a forward hook on the sampler:
decoded row-steps (rows x single-token forwards) and prefill tokens; timed: wall and this
process's CPU seconds. Repeats alternate the order; one warm-up repeat of each is not counted.

Run:  python benchmarks/agent_rollout.py [--repeats 3] [--checkpoint RUN_DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from dataclasses import replace

import torch

from _alternate import alternate
from gear_rl.sampling import SamplingParams, sample_responses
from gear_rl.signals import prompt_ids
from gear_rl.train import episodes, load_config
from gear_rl.train.runtime import build_runtime, rollout_settings


def _to_largest_budget(model, sampling: SamplingParams, generator, row_stop=None,
                       reuse_cache=False):
    """The previous ``generate``: every row of a round decoded to the round's largest budget
    (or its end of turn); ``row_stop`` is ignored, and every turn is prefilled whole (the
    benchmark passes ``reuse_cache=False`` to both engines)."""
    def generate(prompts, stop_strings, budgets):
        turn = replace(sampling, max_new_tokens=max(budgets), paired_draws=False)
        return sample_responses(model, prompts, turn, generator=generator).response_ids
    return generate


def counted_collect(runtime, problems, prompts, settings, repeat: int):
    """``episodes.collect`` with ``settings`` and a generator seeded with ``repeat``, counted
    and timed: returns the rows and a record of wall and CPU seconds, decoded row-steps (rows x
    single-token forwards) and prefill tokens, read by a forward hook on the sampler."""
    counts = {"decoded_row_steps": 0, "prefill_tokens": 0}

    def count(_module, _args, kwargs) -> None:
        ids = kwargs["input_ids"]
        if ids.shape[1] == 1:
            counts["decoded_row_steps"] += ids.shape[0]
        else:
            counts["prefill_tokens"] += ids.numel()

    handle = runtime.sampler.register_forward_pre_hook(count, with_kwargs=True)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        rows = episodes.collect(runtime.task, problems, prompts, **settings,
                                generator=torch.Generator().manual_seed(repeat))
    finally:
        handle.remove()
    return rows, {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                  **counts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="counted repeats per engine")
    parser.add_argument("--checkpoint", default=None,
                        help="policy weights (a run directory or checkpoint folder): a trained "
                             "policy calls the tool far more often than the initial one")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    overrides = ["task=tool-math", "rollout.temperature=0.7", "threads=1", *args.overrides]
    config = load_config(None, overrides)
    runtime = build_runtime(config, training=True, checkpoint=args.checkpoint)
    try:
        rollout = config.rollout
        problems = [p for p in runtime.task.train[: rollout.prompts_per_step]
                    for _ in range(rollout.samples_per_prompt)]
        prompts = [prompt_ids(runtime.tokenizer, p.prompt) for p in problems]
        # both engines prefill every turn whole (agent.reuse_kv_cache, benchmarks/turn_kv_reuse.py,
        # is a separate saving): this compares where rows stop, nothing else
        settings = {**rollout_settings(config, runtime), "reuse_cache": False}
        print(f"model {config.model}, {torch.get_num_threads()} threads, {len(prompts)} rows, "
              f"task {runtime.task.name}, T={rollout.temperature}, "
              f"limits {settings['limits']}", file=sys.stderr)
        factories = {"to_largest_budget": _to_largest_budget,
                     "stop_at_call": episodes._generate_fn}
        original = episodes._generate_fn

        def engine(name: str):
            def run(repeat: int) -> dict[str, float]:
                episodes._generate_fn = factories[name]
                try:
                    rows, record = counted_collect(runtime, problems, prompts, settings, repeat)
                finally:
                    episodes._generate_fn = original
                return {**record,
                        "policy_tokens": sum(sum(m) for m in rows.policy_masks or []),
                        "reward_mean": statistics.fmean(rows.rewards),
                        "tool_call_rate": rows.metrics["agent/tool_call_rate"]}
            return run

        median = alternate({name: engine(name) for name in factories}, args.repeats)
    finally:
        runtime.close()
    base, new = median["to_largest_budget"], median["stop_at_call"]
    summary = {"engines": median,
               "ratio_decoded_row_steps": base["decoded_row_steps"] / new["decoded_row_steps"],
               "ratio_wall": base["wall_s"] / new["wall_s"],
               "ratio_cpu": base["cpu_s"] / new["cpu_s"]}
    for name, values in median.items():
        print(f"{name:18s} wall {values['wall_s']:.1f} s  cpu {values['cpu_s']:.1f} s  "
              f"decoded row-steps {values['decoded_row_steps']:.0f}  prefill tokens "
              f"{values['prefill_tokens']:.0f}  reward {values['reward_mean']:.3f}  tool calls "
              f"{values['tool_call_rate']:.2f}")
    print(f"to_largest_budget / stop_at_call: decoded row-steps "
          f"{summary['ratio_decoded_row_steps']:.2f}x, wall {summary['ratio_wall']:.2f}x, "
          f"cpu {summary['ratio_cpu']:.2f}x")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
