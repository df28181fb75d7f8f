"""The sampler's decoding attention on a CPU: its grouped fp32 matmul path
(``rollout.decode_attention``, the default) against transformers' SDPA path, on the same rows.

For each context length the batch is the trainer's shape, ``--rows`` rows in groups of
``--group`` copies of one context: each context is a task prompt repeated up to about that
many tokens, the lengths ragged by up to a quarter so that rows are padded and masked (as in a
multi-turn batch). Every row decodes ``--new-tokens`` tokens (no stop token: this times
decoding, not where rows stop) at the run's temperature, with paired draws (every row samples
with the same uniform numbers in both engines). ``alternate`` runs the two engines in
alternating order; the first repeat is a warm-up. Printed per length: the sampler's tokens/s
with each attention (prefill included, once per distinct context), their ratio in wall time and
in CPU seconds, and how many rows the two sampled identically (bf16 sampler: the two paths
round differently, so a row may part ways after a near-tie). An untimed fp32 greedy check
prints how many rows are identical token for token.

Run: ``python benchmarks/decode_attention.py [--lengths 64,256,512] [--rows 32] [--group 8]
[--new-tokens 64] [--repeats 3] [key=value ...]`` (``threads=2`` unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from _alternate import alternate
from _runtime import training_runtime
from gear_rl.rundir import cpu_model
from gear_rl.sampling import SamplingParams, sample_responses
from gear_rl.signals import prompt_ids


def contexts(runtime, rows: int, group: int, length: int) -> list[list[int]]:
    """``rows`` contexts, ``group`` copies each of ``rows // group`` distinct ones of about
    ``length`` tokens (ragged down to 3/4 of it) built from the task's prompts, each repeated
    until long enough."""
    distinct = max(rows // group, 1)
    out = []
    for i, problem in enumerate(runtime.task.train[:distinct]):
        ids = prompt_ids(runtime.tokenizer, problem.prompt)
        target = length - (length // 4) * i // max(distinct - 1, 1)
        out += [(ids * (target // len(ids) + 1))[-target:]] * group
    return out


def run(model, runtime, prompts: list[list[int]], new_tokens: int, temperature: float,
        fast: bool, seed: int, greedy: bool = False) -> tuple[list[list[int]], float, float]:
    """The sampler on ``prompts``, no stop token: rows, wall seconds, CPU seconds."""
    generator = torch.Generator().manual_seed(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    sampling = SamplingParams(max_new_tokens=new_tokens, stop_ids=[], pad_id=runtime.pad_id,
                              temperature=temperature, greedy=greedy, paired_draws=True,
                              fast_attention=fast)
    result = sample_responses(model, prompts, sampling, generator=generator)
    return result.response_ids, time.perf_counter() - wall, time.process_time() - cpu


def bench_length(runtime, args, temperature: float, length: int) -> dict:
    rows, repeats = args.rows, args.repeats
    prompts = contexts(runtime, rows, args.group, length)
    outputs: dict[str, list[list[int]]] = {}

    def engine(fast: bool):
        def once(repeat: int) -> dict[str, float]:
            responses, wall, cpu = run(runtime.sampler, runtime, prompts, args.new_tokens,
                                       temperature, fast, repeat)
            outputs[f"{fast}-{repeat}"] = responses
            tokens = sum(len(r) for r in responses)
            return {"tok_per_s": tokens / wall, "cpu_tok_per_s": tokens / cpu,
                    "tokens": float(tokens)}
        return once

    medians = alternate({"grouped": engine(True), "sdpa": engine(False)}, repeats)
    same = [outputs[f"True-{r}"][i] == outputs[f"False-{r}"][i]
            for r in range(1, repeats + 1) for i in range(rows)]
    return {"length": length, "prompt_lengths": [min(map(len, prompts)), max(map(len, prompts))],
            "grouped_tok_per_s": medians["grouped"]["tok_per_s"],
            "sdpa_tok_per_s": medians["sdpa"]["tok_per_s"],
            "ratio": medians["grouped"]["tok_per_s"] / medians["sdpa"]["tok_per_s"],
            "ratio_cpu": medians["grouped"]["cpu_tok_per_s"] / medians["sdpa"]["cpu_tok_per_s"],
            "rows_identical": f"{sum(same)}/{len(same)}"}


def fp32_check(runtime, args, length: int) -> str:
    """Greedy rows of the fp32 policy with each attention: how many are identical."""
    prompts = contexts(runtime, args.rows, args.group, length)
    fast, _, _ = run(runtime.model, runtime, prompts, args.new_tokens, 1.0, True, 0, greedy=True)
    slow, _, _ = run(runtime.model, runtime, prompts, args.new_tokens, 1.0, False, 0, greedy=True)
    return f"{sum(a == b for a, b in zip(fast, slow, strict=True))}/{len(prompts)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="64,256,512", help="context lengths (tokens)")
    parser.add_argument("--rows", type=int, default=32, help="rows per batch")
    parser.add_argument("--group", type=int, default=8, help="copies of each context")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per row")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per engine")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    overrides, config, runtime = training_runtime(args.overrides)
    if args.rows < 1 or args.group < 1 or args.new_tokens < 1:
        raise SystemExit("--rows, --group and --new-tokens must be at least 1")
    lengths = [int(x) for x in args.lengths.split(",")]
    results = [bench_length(runtime, args, config.rollout.temperature, n) for n in lengths]
    dtype = next(runtime.sampler.parameters()).dtype
    print(f"{cpu_model()}; model {config.model} sampler {dtype}, {torch.get_num_threads()} "
          f"threads, {args.rows} rows ({args.group} per context), {args.new_tokens} new tokens, "
          f"T={config.rollout.temperature}, {args.repeats} repeats")
    for r in results:
        print(f"context {r['prompt_lengths'][0]}-{r['prompt_lengths'][1]} tokens: grouped "
              f"{r['grouped_tok_per_s']:.0f} tok/s, sdpa {r['sdpa_tok_per_s']:.0f} tok/s, ratio "
              f"{r['ratio']:.2f}x (CPU s {r['ratio_cpu']:.2f}x); rows sampled identically "
              f"{r['rows_identical']}")
    check = fp32_check(runtime, args, lengths[-1])
    print(f"fp32 policy, greedy, context {lengths[-1]}: rows identical {check}")
    print(json.dumps({"overrides": overrides, "dtype": str(dtype), "cpu": cpu_model(),
                      "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
                      "fp32_greedy_identical": check, "lengths": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
