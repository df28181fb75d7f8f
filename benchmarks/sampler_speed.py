"""The trainer's KV-cache sampler against ``model.generate`` on the trainer's rollout batch.

Model and batch as the trainer builds them (``build_runtime``): SmolLM2-135M-Instruct (the
bundled model; ``model=`` overrides it), the sampler copy in ``rollout.dtype`` (``auto``: bf16
where the CPU computes bf16 natively), ``threads`` torch threads (default 2), and the first
``rollout.prompts_per_step`` (4) problems of the task (``products``) each repeated
``rollout.samples_per_prompt`` (8) times, chat-templated by ``gear_rl.signals.prompt_ids``;
``rollout.max_new_tokens`` (32) new tokens, the run's stop ids. Two modes:

- ``sample``: ``rollout.temperature`` (1.0) and ``rollout.top_p`` (1.0) for both
  (``generate`` with ``top_k=0``, so both sample the full distribution);
- ``greedy``: ``SamplingParams(greedy=True)`` against ``generate(do_sample=False)``, and a
  check that every row is identical token for token up to its first stop token.

Then, untimed (see ``greedy_checks``): greedy in fp32 on the same batch, the bf16 sampler
against ``generate`` on the distinct prompts (the batch the sampler prefills), and whether
``generate``'s own bf16 greedy output depends on the batch (it does on this CPU: bf16 matmul
rounding varies with the batch shape, which is why the timed bf16 comparison can say NO).

Each repeat runs both engines in alternating order (one warm-up repeat is not timed). Tokens per
second count each row up to its first stop token (``generate`` pads rows that stopped until the
longest finishes; those pads are not counted). Printed: median tokens/s of each engine, the
median of the per-repeat ratios ours/generate in wall time, and the same ratio in CPU seconds of
this process (less sensitive to other busy processes on a shared machine), then one JSON line.

Run:  python benchmarks/sampler_speed.py [--repeats 5] [--modes sample,greedy] [key=value ...]
(keys as for ``gear-rl train``; e.g. ``model=tiny-random`` for a quick check).
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

import torch

from _runtime import training_runtime
from gear_rl.sampling import SamplingParams, sample_responses
from gear_rl.signals import prompt_ids


def _until_stop(rows: list[list[int]], stops: set[int]) -> list[list[int]]:
    """Each row cut after its first stop token."""
    out = []
    for row in rows:
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        out.append(row if cut is None else row[: cut + 1])
    return out


def _timed(fn, *args):
    """``fn(*args)``, its wall seconds and this process's CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _batch(runtime, config) -> list[list[int]]:
    """The trainer's rollout prompts: the task's first problems, each repeated K times."""
    rollout = config.rollout
    problems = runtime.task.train[: rollout.prompts_per_step]
    return [prompt_ids(runtime.tokenizer, p.prompt) for p in problems
            for _ in range(rollout.samples_per_prompt)]


def _engines(model, runtime, config, prompts: list[list[int]], greedy: bool):
    """``ours(seed)`` and ``theirs(seed)``: the sampler and ``model.generate`` on ``prompts``
    (one left-padded batch for ``generate``), each returning rows cut after their first stop."""
    rollout = config.rollout
    stops, pad = set(runtime.stop_ids), runtime.pad_id
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                             device=device)
    sampling = ({"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
                if greedy else {"do_sample": True, "temperature": rollout.temperature,
                                "top_p": rollout.top_p, "top_k": 0})
    ours_sampling = SamplingParams(max_new_tokens=rollout.max_new_tokens, stop_ids=stops,
                                   pad_id=pad, temperature=rollout.temperature,
                                   top_p=rollout.top_p, greedy=greedy)

    def ours(seed: int) -> list[list[int]]:
        generator = torch.Generator(device=device).manual_seed(seed)
        return sample_responses(model, prompts, ours_sampling,
                                generator=generator).response_ids

    def theirs(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        with torch.no_grad():
            generated = model.generate(input_ids=input_ids, attention_mask=attention,
                                       max_new_tokens=rollout.max_new_tokens,
                                       eos_token_id=sorted(stops), pad_token_id=pad,
                                       **sampling)
        return _until_stop(generated[:, width:].tolist(), stops)

    return ours, theirs


def bench(runtime, config, mode: str, repeats: int) -> dict:
    """Median tokens/s of the sampler and of ``generate`` in ``mode`` over ``repeats`` timed
    alternating repeats, their ratios, and (greedy) whether the outputs are identical."""
    prompts = _batch(runtime, config)
    greedy = mode == "greedy"
    ours, theirs = _engines(runtime.sampler, runtime, config, prompts, greedy)
    runs: dict[str, list[tuple[int, float, float]]] = {"ours": [], "generate": []}
    identical = True
    for repeat in range(repeats + 1):  # repeat 0 warms up
        order = [("ours", ours), ("generate", theirs)]
        outputs = {}
        for name, fn in order if repeat % 2 else order[::-1]:
            rows, wall, cpu = _timed(fn, repeat)
            outputs[name] = rows
            if repeat:
                runs[name].append((sum(len(r) for r in rows), wall, cpu))
        if greedy:
            identical &= outputs["ours"] == outputs["generate"]
        if repeat:
            (ot, ow, oc), (gt, gw, gc) = runs["ours"][-1], runs["generate"][-1]
            print(f"  {mode} repeat {repeat}: ours {ot / ow:.0f} tok/s ({ot} tok, {ow:.2f} s, "
                  f"{oc:.2f} CPU s), generate {gt / gw:.0f} tok/s ({gt} tok, {gw:.2f} s, "
                  f"{gc:.2f} CPU s)", file=sys.stderr, flush=True)
    result = {
        "ours_tok_per_s": statistics.median(t / w for t, w, _ in runs["ours"]),
        "generate_tok_per_s": statistics.median(t / w for t, w, _ in runs["generate"]),
        "ours_over_generate": statistics.median(
            (o[0] / o[1]) / (g[0] / g[1]) for o, g in zip(runs["ours"], runs["generate"],
                                                          strict=True)),
        "ours_over_generate_cpu": statistics.median(
            (o[0] / o[2]) / (g[0] / g[2]) for o, g in zip(runs["ours"], runs["generate"],
                                                          strict=True)),
        "rows": len(prompts), "prompt_lengths": sorted({len(p) for p in prompts}),
    }
    if greedy:
        result["greedy_identical"] = identical
    return result


def greedy_checks(runtime, config) -> dict[str, bool]:
    """Greedy agreement beyond the timed batch (untimed):

    - ``fp32_identical``: the fp32 policy (the weights the sampler copy is cast from), sampler vs
      ``generate`` on the same batch, every row token for token;
    - ``distinct_identical``: the bf16 sampler on the batch vs ``generate`` on the distinct
      prompts alone (the batch the sampler prefills), each row against its prompt's;
    - ``generate_batch_invariant``: ``generate``'s own bf16 greedy rows on the full batch equal
      its rows on the distinct prompts (False: bf16 rounding depends on the batch shape, so
      no engine that changes the batch can match it token for token).
    """
    prompts = _batch(runtime, config)
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    index = [distinct.index(tuple(p)) for p in prompts]
    out = {}
    if runtime.model is not runtime.sampler:
        ours, theirs = _engines(runtime.model, runtime, config, prompts, greedy=True)
        out["fp32_identical"] = ours(0) == theirs(0)
    ours, theirs = _engines(runtime.sampler, runtime, config, prompts, greedy=True)
    _, theirs_distinct = _engines(runtime.sampler, runtime, config, [list(p) for p in distinct],
                                  greedy=True)
    by_prompt = theirs_distinct(0)
    out["distinct_identical"] = ours(0) == [by_prompt[i] for i in index]
    out["generate_batch_invariant"] = theirs(0) == [by_prompt[i] for i in index]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per mode")
    parser.add_argument("--modes", default="sample,greedy", help="comma-separated: sample,greedy")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    overrides, config, runtime = training_runtime(args.overrides)
    results = {mode: bench(runtime, config, mode, args.repeats)
               for mode in args.modes.split(",")}
    checks = greedy_checks(runtime, config)
    dtype = next(runtime.sampler.parameters()).dtype
    print(f"model {config.model} ({dtype}), {torch.get_num_threads()} threads, "
          f"{config.rollout.prompts_per_step}x{config.rollout.samples_per_prompt} rows, "
          f"{config.rollout.max_new_tokens} new tokens, {args.repeats} repeats")
    for mode, r in results.items():
        extra = (f"; identical to generate on this batch: "
                 f"{'yes' if r['greedy_identical'] else 'NO'} ({dtype})"
                 if "greedy_identical" in r else "")
        print(f"{mode:>6}: sampler {r['ours_tok_per_s']:.0f} tok/s, generate "
              f"{r['generate_tok_per_s']:.0f} tok/s, ratio {r['ours_over_generate']:.2f}x "
              f"(CPU seconds {r['ours_over_generate_cpu']:.2f}x; goal >= 1.5){extra}")
    print("greedy, untimed: " + ", ".join(f"{k} {'yes' if v else 'NO'}"
                                          for k, v in checks.items()))
    print(json.dumps({"overrides": overrides, "dtype": str(dtype), **checks,
                      "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
                      **{f"{m}_{k}": v for m, r in results.items() for k, v in r.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
