"""Continuation throughput of the credit check's shared-prefix estimator against independent
``model.generate`` calls for the same continuations (issue 16; goal >= 3x).

One trajectory of the default task (a prompt and a response sampled by the policy) is continued
from every response-token boundary, ``--samples`` continuations per boundary, each with the
budget the rollout had left (``max_new_tokens`` minus the tokens already generated), at the
rollout's temperature and top-p:

- ``shared``: :func:`gear_rl.credit_check.sample_from_prefixes` with ``shared=True`` (one
  forward over the whole prefix into a KV cache, every cut's continuations decoded from it,
  several cuts per batch), what ``gear-rl credit-check`` runs;
- ``generate``: for each cut, ``model.generate(prefix[:c], num_return_sequences=m,
  do_sample=True, max_new_tokens=budget)`` (each cut prefilled on its own, one call per cut);
- ``afresh``: the same estimator with ``shared=False`` (the trainer's sampler on copies of each
  prefix), for reference.

The methods alternate, ``--repeats`` rounds each, in one process; the throughput counts the
continuation tokens kept (up to a row's first stop token, within its cut's budget). Prints a
table, the median ratio shared / generate, and one JSON line.

Run:  python benchmarks/credit_check_speed.py [--tiny] [--samples 8] [--repeats 3]
      [--threads N] [--dtype auto|bf16|fp32]
(SmolLM2-135M, the bundled model, by default; ``--tiny`` a tiny random model for a quick
check). On a shared CPU, run it when the machine is quiet: it measures wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from gear_rl.credit_check import sample_from_prefixes
from gear_rl.models import load_policy
from gear_rl.sampling import SamplingParams, sample_responses, stop_token_ids
from gear_rl.signals import prompt_ids
from gear_rl.tasks import load_task
from gear_rl.train.runtime import bf16_is_native, resolve_device


def _kept(rows: list[list[int]], stops: set[int], budget: int) -> int:
    total = 0
    for row in rows:
        for token in row[:budget]:
            total += 1
            if token in stops:
                break
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model")
    parser.add_argument("--samples", type=int, default=8, help="continuations per boundary")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="continuation rows per decoding batch (shared and afresh)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                        help="sampler weights (auto: bf16 where native, as the trainer)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and bf16_is_native(device))
    model, tokenizer = load_policy("tiny-random" if args.tiny else "smollm2-135m",
                                   dtype=torch.bfloat16 if bf16 else torch.float32,
                                   device=device, seed=args.seed)
    model.eval()
    stops = stop_token_ids(tokenizer, model)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0])
    problem = load_task("products", train_size=16, eval_size=4, seed=0).train[0]
    prompt = prompt_ids(tokenizer, problem.prompt)
    settings = {"temperature": args.temperature, "top_p": args.top_p}
    generator = torch.Generator(device=device).manual_seed(args.seed)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, stop_ids=stops, pad_id=pad,
                              **settings)
    response: list[int] = []
    for _ in range(20):  # a response of some length, as the credit check continues
        response = sample_responses(model, [prompt], sampling,
                                    generator=generator).response_ids[0]
        if len(response) >= 8:
            break
    prefix = prompt + response
    cuts = [len(prompt) + b for b in range(len(response))]
    budgets = [args.max_new_tokens - b for b in range(len(response))]
    stop_set = set(stops)
    model_name = "tiny-random" if args.tiny else "smollm2-135m"
    print(f"model {model_name} ({next(model.parameters()).dtype}, {device}, "
          f"{torch.get_num_threads()} threads); prompt {len(prompt)} tokens, response "
          f"{len(response)} tokens -> {len(cuts)} cuts x {args.samples} continuations",
          file=sys.stderr)

    def shared(seed: int, share: bool = True) -> int:
        conts, _, _ = sample_from_prefixes(
            model, [prefix], [(0, c) for c in cuts], args.samples, budgets=budgets,
            stop_ids=stops, pad_id=pad,
            generator=torch.Generator(device=device).manual_seed(seed),
            batch_size=args.batch_size, shared=share, **settings)
        return sum(_kept(rows, stop_set, budget) for rows, budget in zip(conts, budgets,
                                                                         strict=True))

    @torch.no_grad()
    def generate(seed: int) -> int:
        torch.manual_seed(seed)
        total = 0
        for cut, budget in zip(cuts, budgets, strict=True):
            inputs = torch.tensor([prefix[:cut]], device=device)
            out = model.generate(
                input_ids=inputs, attention_mask=torch.ones_like(inputs), do_sample=True,
                num_return_sequences=args.samples, max_new_tokens=budget,
                temperature=args.temperature, top_p=args.top_p, top_k=0, eos_token_id=stops,
                pad_token_id=pad)
            total += _kept(out[:, cut:].tolist(), stop_set, budget)
        return total

    methods = {"shared": shared, "generate": generate,
               "afresh": lambda seed: shared(seed, share=False)}
    rates: dict[str, list[float]] = {name: [] for name in methods}
    tokens: dict[str, list[int]] = {name: [] for name in methods}
    shared(args.seed + 999)  # warm-up (allocations, kernels)
    generate(args.seed + 999)
    for round_index in range(args.repeats):
        order = list(methods) if round_index % 2 == 0 else list(reversed(methods))
        for name in order:
            started = time.perf_counter()
            count = methods[name](args.seed + round_index)
            seconds = time.perf_counter() - started
            rates[name].append(count / seconds)
            tokens[name].append(count)
            print(f"round {round_index + 1} {name:<8} {count:6d} tokens {seconds:7.2f} s "
                  f"{count / seconds:8.1f} tok/s", file=sys.stderr)
    median = {name: statistics.median(values) for name, values in rates.items()}
    ratios = [s / g for s, g in zip(rates["shared"], rates["generate"], strict=True)]
    print("\nmethod     median tok/s   tokens per round")
    for name in methods:
        print(f"{name:<10} {median[name]:12.1f}   {tokens[name]}")
    print(f"\nshared / generate: median of per-round ratios {statistics.median(ratios):.2f}x "
          f"(goal >= 3x); shared / afresh {median['shared'] / median['afresh']:.2f}x")
    print(json.dumps({"model": model_name,
                      "dtype": str(next(model.parameters()).dtype), "device": str(device),
                      "threads": torch.get_num_threads(), "prompt_tokens": len(prompt),
                      "response_tokens": len(response), "samples": args.samples,
                      "median_tok_per_s": median, "ratio_shared_generate":
                      statistics.median(ratios), "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
