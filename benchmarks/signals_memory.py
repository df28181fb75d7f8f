"""Peak memory and time of the chunked signal pass against the naive full-logits pass.

    python benchmarks/signals_memory.py [--quick] [--device cpu|cuda] [--repeats 3]
        [--chunk-size N] [--layers 2] [--threads N] [--grad] [--bf16] [--skip-smollm2]
        [--skip-compare]

Part 1, chunked vs naive (issue 3's goal: peak extra memory <= 1/8 of naive at <= 1.1x its
time). Model: a random Llama with SmolLM2-135M's vocabulary (49,152) and width (hidden 576,
9 heads, 3 KV heads, MLP 1536) but only ``--layers`` (2) layers, so the LM head, the part the
chunking changes, dominates; the backbone costs both passes the same. Batch: B = 8 responses of
1,024 tokens after 64-token student prompts and 96-token teacher prompts (``--quick``: B = 2,
256 tokens, chunks of 64 rows). Both passes compute the same thing: student and teacher
log-probs of the sampled tokens, student entropy, exact (``full``) reverse KL, no gradients.

- ``chunked``: ``gear_rl.signals.token_signals`` (backbone once per side, then the LM head and
  the softmax maths over ``chunk_size`` response positions at a time);
- ``naive``: what one writes first: ``model(ids).logits`` ([B, L, V]) for each side, slice the
  response positions, ``log_softmax`` in fp32, gather, entropy and KL over the full tensors.

How memory is measured, honestly: each pass's memory is measured in its own fresh subprocess.
On CPU, after one warm-up pass the worker returns freed heap memory to the OS (``malloc_trim``),
resets the kernel's peak-RSS counter (``/proc/self/clear_refs`` <- 5), reads ``VmRSS`` as the
baseline, runs the pass once and reads ``VmHWM`` (the peak RSS since the reset). Peak extra
memory = VmHWM - baseline: everything the pass touched beyond the loaded model and inputs,
torch's allocations included (which ``tracemalloc`` cannot see). ``MALLOC_MMAP_THRESHOLD_`` is
fixed at 64 KiB in the workers so that glibc maps every large tensor freshly and returns it on
free, rather than recycling heap the baseline already counts (which would flatter the pass). On
CUDA:
``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus the allocated
bytes before the pass. Time: a third subprocess warms both passes up, then alternates them
``--repeats`` times (so load from other processes hits both alike); medians are compared.

``--grad`` adds the same comparison for a training step: ``student_requires_grad=True`` and a
backward pass through a loss on all four fields (the chunked pass checkpoints each chunk).

Part 2: the teacher pass alone (``response_logprobs`` on ground-truth-conditioned prompts) and the
whole ``token_signals`` pass on the bundled SmolLM2-135M-Instruct, for 16 responses of 256 tokens
(``--quick``: 4 of 64), in fp32 (and bf16 on CUDA or with ``--bf16``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from gear_rl.models import SMOLLM2_135M_SHAPE
from gear_rl.signals import build_prompt_pairs, response_logprobs, token_signals

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import reset_peak, status_bytes

VOCAB = SMOLLM2_135M_SHAPE["vocab_size"]


def _configuration(quick: bool) -> dict:
    if quick:
        return dict(batch=2, response=256, prompt=64, teacher_prompt=96)
    return dict(batch=8, response=1024, prompt=64, teacher_prompt=96)


def _inputs(config: dict, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[list[int]]:
        return torch.randint(0, VOCAB, (config["batch"], n), generator=generator).tolist()

    return ids(config["prompt"]), ids(config["teacher_prompt"]), ids(config["response"])


def naive_signals(model, prompts, teachers, responses, *, grad: bool = False):
    """The full-logits pass: every field over complete [B, T, V] tensors (equal-length batch)."""
    length = len(responses[0])
    targets = torch.tensor(responses, device=model.device)[..., None]
    with torch.set_grad_enabled(grad):
        ids = torch.tensor([p + r for p, r in zip(prompts, responses, strict=True)],
                           device=model.device)
        start = len(prompts[0]) - 1
        student = torch.log_softmax(model(ids).logits[:, start:start + length].float(), -1)
    with torch.no_grad():
        ids = torch.tensor([p + r for p, r in zip(teachers, responses, strict=True)],
                           device=model.device)
        start = len(teachers[0]) - 1
        teacher = torch.log_softmax(model(ids).logits[:, start:start + length].float(), -1)
    with torch.set_grad_enabled(grad):
        probs = student.exp()
        return (student.gather(-1, targets)[..., 0], teacher.gather(-1, targets)[..., 0],
                -(probs * student).sum(-1), (probs * (student - teacher)).sum(-1))


def _worker(args: argparse.Namespace) -> None:
    """One measurement in a fresh process: the peak extra memory of one pass (``--worker naive``
    or ``chunked``), or both passes' times, interleaved (``--worker time``)."""
    from gear_rl.models import tiny_random_model

    device = torch.device(args.device)
    config = _configuration(args.quick)
    shape = {**SMOLLM2_135M_SHAPE, "num_layers": args.layers, "tie_word_embeddings": False}
    model = tiny_random_model("llama", **shape, device=device)
    prompts, teachers, responses = _inputs(config)

    def run(method: str) -> tuple[torch.Tensor, ...]:
        if method == "chunked":
            sig = token_signals(model, prompts, teachers, responses, chunk_size=args.chunk_size,
                                student_requires_grad=args.grad)
            fields = (sig.student_logprobs, sig.teacher_logprobs, sig.entropy, sig.divergence)
        else:
            fields = naive_signals(model, prompts, teachers, responses, grad=args.grad)
        if args.grad:
            (fields[0] + fields[2] + fields[3]).mean().backward()
            model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return tuple(f.detach() for f in fields)

    if args.worker == "time":
        # Interleaved, so that load from other processes hits both methods alike.
        methods = ("naive", "chunked")
        times: dict[str, list[float]] = {m: [] for m in methods}
        checksums = {m: [float(f.double().sum()) for f in run(m)] for m in methods}  # warm-up
        for _ in range(args.repeats):
            for method in methods:
                start = time.perf_counter()
                run(method)
                times[method].append(time.perf_counter() - start)
        print(json.dumps(dict(times=times, checksums=checksums)))
        return

    run(args.worker)  # warm-up
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        reset_peak()
        baseline = status_bytes("VmRSS")
    run(args.worker)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = status_bytes("VmHWM") - baseline
    print(json.dumps(dict(peak_extra_bytes=peak)))


def _spawn(args: argparse.Namespace, worker: str, grad: bool) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", worker,
               "--device", args.device, "--repeats", str(args.repeats),
               "--layers", str(args.layers)]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    if args.quick:
        command.append("--quick")
    if grad:
        command.append("--grad")
    if args.chunk_size is not None:
        command += ["--chunk-size", str(args.chunk_size)]
    env = dict(os.environ)
    if worker != "time":  # memory workers only: timing runs under the default malloc settings
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker {worker} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace, grad: bool) -> None:
    config = _configuration(args.quick)
    label = "forward + backward" if grad else "forward (no grad)"
    print(f"\n== chunked vs naive, {label}: V={VOCAB}, B={config['batch']}, "
          f"{config['response']} response tokens, prompts {config['prompt']}/"
          f"{config['teacher_prompt']}, {args.layers} layers, device {args.device}")
    memory = {m: _spawn(args, m, grad)["peak_extra_bytes"] for m in ("naive", "chunked")}
    timing = _spawn(args, "time", grad)
    seconds = {m: statistics.median(t) for m, t in timing["times"].items()}
    for method in ("naive", "chunked"):
        runs = ", ".join(f"{t:.2f}" for t in timing["times"][method])
        print(f"{method:>8}: peak extra {memory[method] / 2**20:9.1f} MiB   "
              f"time {seconds[method]:7.3f} s   (runs: {runs})")
    memory_ratio = memory["chunked"] / memory["naive"]
    time_ratio = seconds["chunked"] / seconds["naive"]
    paired = statistics.median(c / n for c, n in zip(timing["times"]["chunked"],
                                                      timing["times"]["naive"], strict=True))
    agree = max(abs(a - b) / max(1.0, abs(b)) for a, b in
                zip(timing["checksums"]["chunked"], timing["checksums"]["naive"], strict=True))
    met = memory_ratio <= 0.125 and time_ratio <= 1.1
    print(f"  ratios chunked/naive: memory {memory_ratio:.3f} (1/{1 / memory_ratio:.1f}), "
          f"time {time_ratio:.3f} (median of per-round ratios {paired:.3f})   "
          f"goal: memory <= 0.125, time <= 1.1 -> {'met' if met else 'NOT met'}")
    print(f"  same results: largest relative difference of the field sums {agree:.1e}")


def _median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def smollm2(args: argparse.Namespace) -> None:
    from gear_rl.models import load_policy

    count, length = (4, 64) if args.quick else (16, 256)
    device = torch.device(args.device)
    questions = [f"What is {3 + i} * {7 + 2 * i}? Think step by step." for i in range(count)]
    references = [str((3 + i) * (7 + 2 * i)) for i in range(count)]
    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(0, VOCAB, (count, length), generator=generator).tolist()
    dtypes = [torch.float32]
    if args.bf16 or device.type == "cuda":
        dtypes.append(torch.bfloat16)
    for dtype in dtypes:
        model, tokenizer = load_policy("smollm2-135m", dtype=dtype, device=device)
        student, teacher = build_prompt_pairs(
            tokenizer, [[{"role": "user", "content": q}] for q in questions], references)
        # warm-up on a small batch, so kernel selection is not timed
        token_signals(model, student[:2], teacher[:2], [r[:16] for r in responses[:2]])
        teacher_s = _median_seconds(lambda m=model, t=teacher: response_logprobs(m, t, responses),
                                    args.repeats, device)
        both_s = _median_seconds(
            lambda m=model, s=student, t=teacher: token_signals(m, s, t, responses),
            max(1, args.repeats - 1), device)
        tokens = count * length
        print(f"SmolLM2-135M {str(dtype).removeprefix('torch.'):>8}: teacher pass "
              f"{teacher_s:6.2f} s ({tokens / teacher_s:6.0f} response tok/s); token_signals "
              f"(student + teacher, full KL) {both_s:6.2f} s   [{count} x {length} tokens, "
              f"teacher prompts {min(map(len, teacher))}-{max(map(len, teacher))} tokens]")
        del model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="B=2, 256 tokens, chunk size 64 unless given; SmolLM2 4 x 64")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (on a machine shared with other jobs, 1 thread "
                             "can be faster than 2)")
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--grad", action="store_true", help="also compare forward + backward")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--skip-compare", action="store_true", help="only the SmolLM2 timing")
    parser.add_argument("--bf16", action="store_true",
                        help="also time SmolLM2 in bf16 (default on CUDA only: CPUs without "
                             "native bf16 matmul run it several times slower than fp32)")
    parser.add_argument("--worker", choices=["chunked", "naive", "time"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick and args.chunk_size is None:
        # The default chunk (682 rows at this vocabulary) would hold the whole quick batch.
        args.chunk_size = 64
    if args.worker:
        _worker(args)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    if not args.skip_compare:
        compare(args, grad=False)
        if args.grad:
            compare(args, grad=True)
    if not args.skip_smollm2:
        print("\n== teacher pass on the bundled SmolLM2-135M-Instruct")
        smollm2(args)


if __name__ == "__main__":
    main()
