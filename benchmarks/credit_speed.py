"""Speed of the credit core on a verl-sized batch, against baselines measured in the same run.

    python benchmarks/credit_speed.py [--rows 1024] [--length 8192] [--repeats 7]
                                      [--trace RUN_DIR_OR_SAMPLES_JSONL] [--passes-only]
                                      [--kernel-only] [--heap-reuse]

Batches are ``rows`` trajectories of up to ``length`` response tokens, lengths varied (right
padding), each with a 64-token observation span (mask 0) a third of the way in, groups of 8.

Kernel table (issue 38; always printed first, alone with ``--kernel-only``):

- ``first compile``: the first ``gear_advantages`` call (default config, the default trainer
  batch) in a fresh interpreter whose numba cache is an empty directory (``NUMBA_CACHE_DIR``):
  what a user's first run pays. Goal: < 3 s.
- ``gear_advantages`` (kl_entropy) in ms and in elementwise passes at the default trainer batch
  (``rollout.prompts_per_step x samples_per_prompt`` rows, ``max_new_tokens`` columns: 32 x 32)
  and at ``rows x length`` dense, with torch's threads (the kernel is parallel over rows) and
  with one (what the parallel loop buys); at the default batch also the plain-Python
  specification (``gear_advantages_reference``). Goal: < 8 passes at 1024 x 8192 dense.

Main table, on the ``dense`` batch (median of ``repeats`` runs after one warm-up):

- ``elementwise``: one elementwise pass over the ``[B, T]`` tensor (``advantages * mask``), the
  unit the goals are stated in;
- ``verl_grpo``: verl's ``compute_grpo_outcome_advantage`` on the same batch (if verl imports);
- ``grpo``: ``grpo_advantages`` broadcast over the mask (``get_estimator("grpo")``);
- ``gear``: ``grpo_advantages`` + ``gear_advantages`` (the full GEAR estimator), for each
  segmentation mode. Goal (issue 2): GEAR <= 1.5x verl's GRPO on the same batch.

Passes table (issue 15, "Credit kernel on dense spikes"): ``gear_advantages`` alone, in
elementwise passes: per repeat, its time over one ``advantages * mask`` on the same tensor
measured right before it; the median over repeats. Every segmentation mode, at these densities:

- ``sparse``: divergence spikes (``d ~ U(1, 3)``, else ``U(0, 0.2)``) at 0.4% of tokens, entropy
  bursts (``H ~ U(2, 2.5)``, else ``U(0.8, 1.2)``) at 10%: a spike opens a segment, the next
  burst ends it (a baseline token never does: ``1.2 < 1.5 * 0.8``). Few, short segments.
- ``dense``: spikes at 30% of tokens, bursts at 8%: most policy tokens inside segments, tens of
  onsets per 1k tokens, as in real runs (the default run keeps 70-90% inside segments).
- ``flicker``: spikes and bursts at 50% each: a segment boundary every few tokens, the worst
  case for a scan that branches on its state.
- ``real``: the per-token divergence, entropy and mask of a run's ``samples.jsonl``, each
  sample's divergence min-max normalised over its own policy tokens (so that laying samples end
  to end keeps the spike structure each sample had in training: the kernel then normalises the
  tiled row to the same values) and followed by one policy token of very high entropy (which
  ends any open segment, as the sample's end did), laid end to end and tiled to
  ``rows x length``. ``--trace``
  takes the file or its run directory; by default the newest ``runs/*/samples.jsonl``. Make one
  with ``gear-rl train steps=2 log.samples_per_step=32 out=runs/trace`` (the default run).

(The earlier ``rand**8`` / ``rand**4`` divergences with uniform entropy did not differ: with
``H ~ U(0, 2.5)`` a segment whose onset has ``H > 1.67`` never closes, so both gave about 0.6
onsets per 1k tokens with nearly every token inside a segment.)

For each density the table reports, per mode, onsets per 1k policy tokens and the share of
policy tokens inside segments, so that a reader can see the densities differ. Goal (issue 38,
which replaced issue 15's 2 and 3 passes for the hand-interleaved kernel): < 8 passes for every
mode (``!`` marks a miss).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import torch

from gear_rl.credit import (
    CreditBatch,
    GEARConfig,
    gear_advantages,
    gear_advantages_reference,
    gear_segments,
    get_estimator,
    grpo_advantages,
)

MODES = ("kl_entropy", "entropy_window", "none", "kl_only", "entropy_only")
GOAL_PASSES = 8.0  # issue 38, every mode
GOAL_COMPILE_S = 3.0  # issue 38: the first call on a fresh numba cache
# (spike rate, burst rate) of the synthetic densities
DENSITIES = {"sparse": (0.004, 0.10), "dense": (0.30, 0.08), "flicker": (0.50, 0.50)}


def _mask(rows: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``[rows, length]`` right-padded lengths in ``[length / 4, length]``, with a 64-token
    observation span (mask 0) a third of the way into each row."""
    lengths = torch.randint(length // 4, length + 1, (rows,), generator=generator)
    positions = torch.arange(length)
    mask = (positions[None, :] < lengths[:, None]).float()
    starts = lengths // 3
    obs = (positions[None, :] >= starts[:, None]) & (positions[None, :] < starts[:, None] + 64)
    mask[obs] = 0.0
    return mask


def make_batch(rows: int, length: int, spikes: float, bursts: float,
               seed: int = 0) -> CreditBatch:
    """A synthetic batch whose segment density is set by the rate of divergence ``spikes``
    (tokens that open a segment) and of entropy ``bursts`` (tokens that close one); a token is
    at most one of the two."""
    generator = torch.Generator().manual_seed(seed)
    mask = _mask(rows, length, generator)
    kind = torch.rand(rows, length, generator=generator)
    spike = kind < spikes
    burst = (kind >= spikes) & (kind < spikes + bursts)
    uniform = torch.rand(rows, length, generator=generator)
    divergence = torch.where(spike, 1.0 + 2.0 * uniform, 0.2 * uniform)
    uniform = torch.rand(rows, length, generator=generator)
    entropy = torch.where(burst, 2.0 + 0.5 * uniform, 0.8 + 0.4 * uniform)
    rewards = torch.randint(0, 2, (rows,), generator=generator).float()
    return CreditBatch(rewards=rewards, group_ids=[i // 8 for i in range(rows)], mask=mask,
                       divergence=divergence, entropy=entropy)


def find_trace(path: Path | None) -> Path | None:
    """``path`` (a samples.jsonl or a run directory holding one), or the newest
    ``runs/*/samples.jsonl`` under the working directory; None when there is none."""
    if path is not None:
        return path / "samples.jsonl" if path.is_dir() else path
    found = sorted(Path("runs").glob("*/samples.jsonl"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def read_samples(path: Path) -> list[dict[str, list[float]]]:
    """The samples of a ``samples.jsonl`` that carry per-token divergence, entropy and mask."""
    samples = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if all(isinstance(record.get(key), list) for key in ("divergence", "entropy", "mask")):
            samples.append({key: [float(v) for v in record[key]]
                            for key in ("divergence", "entropy", "mask")})
    return samples


def as_logged(samples: list[dict[str, list[float]]]) -> CreditBatch:
    """The samples as one right-padded batch, as the trainer scored them."""
    length = max(len(s["mask"]) for s in samples)

    def pad(key: str) -> torch.Tensor:
        return torch.tensor([s[key] + [0.0] * (length - len(s[key])) for s in samples],
                            dtype=torch.float32)

    return CreditBatch(rewards=torch.zeros(len(samples)), group_ids=list(range(len(samples))),
                       mask=pad("mask"), divergence=pad("divergence"), entropy=pad("entropy"))


BOUNDARY_ENTROPY = 1e4  # above lambda_h times any real entropy: ends every open segment


def trace_batch(samples: list[dict[str, list[float]]], rows: int, length: int) -> CreditBatch:
    """The samples' tokens end to end, tiled to ``[rows, length]``. Each sample's divergence is
    min-max normalised over its own policy tokens first (0 where its range is < 1e-8), and each
    sample is followed by one policy token of divergence 0 and entropy ``BOUNDARY_ENTROPY``,
    which ends any segment still open, as the end of the sample did in training."""
    div: list[float] = []
    ent: list[float] = []
    msk: list[float] = []
    for sample in samples:
        policy = [d for d, m in zip(sample["divergence"], sample["mask"], strict=True) if m]
        low, high = (min(policy), max(policy)) if policy else (0.0, 0.0)
        span = high - low
        div.extend((d - low) / span if span >= 1e-8 else 0.0 for d in sample["divergence"])
        ent.extend(sample["entropy"])
        msk.extend(sample["mask"])
        div.append(0.0)
        ent.append(BOUNDARY_ENTROPY)
        msk.append(1.0)
    reps = -(-rows * length // len(div))

    def tile(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).repeat(reps)[: rows * length].reshape(
            rows, length).contiguous()

    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (rows,), generator=generator).float()
    return CreditBatch(rewards=rewards, group_ids=[i // 8 for i in range(rows)], mask=tile(msk),
                       divergence=tile(div), entropy=tile(ent))


def segment_stats(batch: CreditBatch, mode: str) -> tuple[float, float]:
    """Onsets per 1k policy tokens and the share of policy tokens inside segments."""
    assert batch.divergence is not None and batch.entropy is not None
    onsets = gear_segments(batch.divergence, batch.entropy, batch.mask,
                           GEARConfig(segmentation=mode))
    policy = batch.mask > 0
    positions = torch.arange(onsets.shape[1])[None, :]
    count = max(1, int(policy.sum()))
    starts = int(((onsets == positions) & policy).sum())
    inside = int(((onsets >= 0) & policy).sum())
    return 1e3 * starts / count, inside / count


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (and numba compilation, cached after the first process)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trace", type=Path, default=None,
                        help="samples.jsonl of a run, or its run directory (default: the newest "
                             "runs/*/samples.jsonl)")
    parser.add_argument("--passes-only", action="store_true",
                        help="print only the kernel table and the passes table")
    parser.add_argument("--kernel-only", action="store_true",
                        help="print only the kernel table (issue 38)")
    parser.add_argument("--heap-reuse", action="store_true",
                        help="first apply the trainer's heap_reuse (glibc keeps freed blocks: "
                             "no tensor of the run is page-faulted in afresh, the elementwise "
                             "pass included); without it a 32 MiB result is mmapped and "
                             "faulted in on every call, which is most of the unit's time")
    args = parser.parse_args()
    if args.heap_reuse:
        from gear_rl.train.memory import keep_heap_pages

        print(f"heap reuse applied: {keep_heap_pages()}")
    kernel_table(args)
    if args.kernel_only:
        return
    if not args.passes_only:
        main_table(args)
    passes_table(args)


_FIRST_CALL = """
import sys, time
import torch
from gear_rl.credit import GEARConfig, gear_advantages
rows, length = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator().manual_seed(0)
divergence, entropy = torch.rand(rows, length, generator=g), torch.rand(rows, length, generator=g)
mask, advantages = torch.ones(rows, length), torch.randn(rows, generator=g)
start = time.perf_counter()
gear_advantages(advantages, divergence, entropy, mask, GEARConfig())
print(time.perf_counter() - start)
"""


def first_compile_seconds(rows: int, length: int) -> float:
    """Seconds of the first ``gear_advantages`` call (default config, float32 ``rows x length``)
    in a fresh interpreter whose numba cache is an empty directory: numba's compile and one
    call, what a first run pays."""
    with tempfile.TemporaryDirectory() as cache:
        done = subprocess.run([sys.executable, "-c", _FIRST_CALL, str(rows), str(length)],
                              env={**os.environ, "NUMBA_CACHE_DIR": cache}, check=True,
                              capture_output=True, text=True, timeout=600)
    return float(done.stdout.split()[-1])


def default_batch_shape() -> tuple[int, int]:
    """``(rows, columns)`` of the default trainer's batch: prompts_per_step x
    samples_per_prompt rows of at most max_new_tokens response tokens."""
    from gear_rl.train.config import RolloutConfig

    rollout = RolloutConfig()
    return rollout.prompts_per_step * rollout.samples_per_prompt, rollout.max_new_tokens


def kernel_table(args: argparse.Namespace) -> None:
    """Issue 38: first compile on a fresh cache; ``gear_advantages`` (kl_entropy) in ms and
    elementwise passes at the default trainer batch and at ``rows x length`` dense, with
    torch's threads and with one; the plain-Python reference at the default batch."""
    small = default_batch_shape()
    seconds = first_compile_seconds(*small)
    verdict = "met" if seconds < GOAL_COMPILE_S else "NOT met"
    print(f"first compile (fresh numba cache, first gear_advantages call on {small[0]} x "
          f"{small[1]}, default config): {seconds:.2f} s (goal < {GOAL_COMPILE_S:g} s): "
          f"{verdict}")
    threads = torch.get_num_threads()
    print(f"\ngear_advantages (kl_entropy, dense batch), median of {args.repeats}; passes: its "
          f"time over one advantages * mask on the same batch; 1 thread: torch (so numba) on "
          f"one; reference: gear_advantages_reference (plain Python), small batches only")
    print(f"{'batch':<14}{'elementwise ms':>16}{f'ms, {threads} thr':>12}{'passes':>9}"
          f"{'ms, 1 thr':>11}{'passes':>9}{'reference ms':>14}")
    print(kernel_row(*small, args.repeats, threads, goal=False))
    print(kernel_row(args.rows, args.length, args.repeats, threads, goal=True))
    print()


def kernel_row(rows: int, length: int, repeats: int, threads: int, goal: bool) -> str:
    """One line of :func:`kernel_table` on a dense ``rows x length`` batch (``goal``: mark
    ``GOAL_PASSES`` or more with ``!``)."""
    batch = make_batch(rows, length, *DENSITIES["dense"])
    assert batch.divergence is not None and batch.entropy is not None
    advantages, mask = grpo_advantages(batch.rewards, batch.group_ids), batch.mask
    inputs = (advantages, batch.divergence, batch.entropy, mask)
    base = median_seconds(lambda: advantages[:, None] * mask, repeats)
    kernel = []
    for count in (threads, 1):
        torch.set_num_threads(count)
        try:
            kernel.append(median_seconds(lambda: gear_advantages(*inputs), repeats))
        finally:
            torch.set_num_threads(threads)
    reference = "-"
    if rows * length <= 1 << 16:
        reference = f"{median_seconds(lambda: gear_advantages_reference(*inputs), 3) * 1e3:.2f}"
    flag = "!" if goal and kernel[0] / base >= GOAL_PASSES else " "
    return (f"{f'{rows} x {length}':<14}{base * 1e3:>16.3f}{kernel[0] * 1e3:>12.3f}"
            f"{kernel[0] / base:>8.2f}{flag}{kernel[1] * 1e3:>11.3f}{kernel[1] / base:>9.2f}"
            f"{reference:>14}")


def passes_table(args: argparse.Namespace) -> None:
    """``gear_advantages`` in elementwise passes at each density, every mode (issue 15)."""
    batches: dict[str, CreditBatch | None] = {
        name: make_batch(args.rows, args.length, spikes, bursts)
        for name, (spikes, bursts) in DENSITIES.items()}
    trace = find_trace(args.trace)
    samples = read_samples(trace) if trace is not None and trace.exists() else []
    batches["real"] = trace_batch(samples, args.rows, args.length) if samples else None
    if samples:
        logged = as_logged(samples)
        starts, inside = segment_stats(logged, "kl_entropy")
        print(f"real trace: {trace} ({len(samples)} samples, {int(logged.mask.sum())} policy "
              f"tokens; as trained, kl_entropy: {starts:.0f} onsets/1k tokens, {inside:.0%} of "
              f"policy tokens inside segments)")
    else:
        where = trace if trace is not None else "no runs/*/samples.jsonl"
        print(f"real trace: absent ({where}); make one with `gear-rl train steps=2 "
              f"log.samples_per_step=32 out=runs/trace`")

    print("\nsegments per density (onsets per 1k policy tokens / share of policy tokens inside "
          "segments):")
    print(f"{'density':<10}" + "".join(f"{mode:>20}" for mode in MODES if mode != "none"))
    for name, batch in batches.items():
        if batch is None:
            continue
        cells = []
        for mode in MODES:
            if mode != "none":
                starts, inside = segment_stats(batch, mode)
                cells.append(f"{starts:>11.1f} / {inside:>4.0%}")
        print(f"{name:<10}" + "".join(f"{cell:>20}" for cell in cells))

    print(f"\ngear_advantages on {args.rows} x {args.length} in elementwise passes (median over "
          f"{args.repeats} repeats of time / elementwise measured right before; goal < "
          f"{GOAL_PASSES:g}); numba threads {numba.get_num_threads()}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'density':<10}{'elementwise ms':>16}" + "".join(f"{mode:>16}" for mode in MODES))
    for name, batch in batches.items():
        if batch is None:
            continue
        assert batch.divergence is not None and batch.entropy is not None
        advantages = grpo_advantages(batch.rewards, batch.group_ids)
        configs = {mode: GEARConfig(segmentation=mode) for mode in MODES}
        for config in configs.values():  # warm-up (and compilation)
            gear_advantages(advantages, batch.divergence, batch.entropy, batch.mask, config)
        base_ms: list[float] = []
        ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode, config in configs.items():
                start = time.perf_counter()
                _ = advantages[:, None] * batch.mask
                base = time.perf_counter() - start
                start = time.perf_counter()
                gear_advantages(advantages, batch.divergence, batch.entropy, batch.mask, config)
                ratios[mode].append((time.perf_counter() - start) / base)
                base_ms.append(base * 1e3)
        row = f"{name:<10}{statistics.median(base_ms):>16.1f}"
        for mode in MODES:
            passes = statistics.median(ratios[mode])
            flag = "!" if passes >= GOAL_PASSES else " "
            row += f"{passes:>15.2f}{flag}"
        print(row)


def main_table(args: argparse.Namespace) -> None:
    spikes, bursts = DENSITIES["dense"]
    batch = make_batch(args.rows, args.length, spikes, bursts)
    policy = int(batch.mask.sum())
    print(f"dense batch: {args.rows} x {args.length} ({policy / batch.mask.numel():.0%} policy "
          f"tokens), torch threads {torch.get_num_threads()}, numba threads "
          f"{numba.get_num_threads()}")
    advantages = grpo_advantages(batch.rewards, batch.group_ids)
    timings: dict[str, float] = {}
    timings["elementwise"] = median_seconds(lambda: advantages[:, None] * batch.mask,
                                            args.repeats)
    try:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    except Exception as err:  # verl is optional; say why it is absent
        print(f"verl not importable ({type(err).__name__}: {err}); its row is skipped")
    else:
        token_rewards = torch.zeros_like(batch.mask)
        last = (batch.mask * torch.arange(args.length)).argmax(dim=1)
        token_rewards[torch.arange(args.rows), last] = batch.rewards
        index = np.array([str(g) for g in batch.group_ids], dtype=object)
        timings["verl_grpo"] = median_seconds(
            lambda: compute_grpo_outcome_advantage(token_rewards, batch.mask, index),
            args.repeats)
    timings["grpo"] = median_seconds(lambda: get_estimator("grpo")(batch), args.repeats)
    gear = get_estimator("gear")
    for segmentation in ("kl_entropy", "none", "kl_only", "entropy_only", "entropy_window"):
        config = GEARConfig(segmentation=segmentation)
        timings[f"gear[{segmentation}]"] = median_seconds(lambda c=config: gear(batch, c),
                                                          args.repeats)
    timings["gear_advantages only"] = median_seconds(
        lambda: gear_advantages(advantages, batch.divergence, batch.entropy, batch.mask),
        args.repeats)

    base = timings["elementwise"]
    verl = timings.get("verl_grpo")
    print(f"{'what':<26}{'median ms':>10}{'x elementwise':>15}{'x verl GRPO':>13}")
    for name, seconds in timings.items():
        vs_verl = f"{seconds / verl:>13.2f}" if verl else f"{'-':>13}"
        print(f"{name:<26}{seconds * 1e3:>10.1f}{seconds / base:>15.2f}{vs_verl}")
    if verl:
        ratio = timings["gear[kl_entropy]"] / verl
        verdict = "met" if ratio <= 1.5 else "NOT met"
        print(f"GEAR / verl GRPO = {ratio:.2f} (goal <= 1.5): {verdict}\n")


if __name__ == "__main__":
    main()
