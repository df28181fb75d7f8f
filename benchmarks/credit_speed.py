"""Speed of the credit core on a verl-sized batch, against baselines measured in the same run.

    python benchmarks/credit_speed.py [--rows 1024] [--length 8192] [--repeats 7]

Batch: ``rows`` trajectories of up to ``length`` response tokens, lengths varied (right
padding), each with an observation span (mask 0) in the middle, groups of 8. Timed (median of
``repeats`` runs after one warm-up):

- ``elementwise``: one elementwise pass over the ``[B, T]`` tensor (``advantages * mask``), the
  unit the issue's goal is stated in;
- ``verl_grpo``: verl's ``compute_grpo_outcome_advantage`` on the same batch (if verl imports);
- ``grpo``: ``grpo_advantages`` broadcast over the mask (``get_estimator("grpo")``);
- ``gear``: ``grpo_advantages`` + ``gear_advantages`` (the full GEAR estimator), for each
  segmentation mode.

Goal (issue 2): GEAR <= 1.5x verl's GRPO on the same batch.

Then a density table (issue 15, "Credit kernel on dense spikes"): ``gear_advantages`` alone in
elementwise passes (its time / one ``advantages * mask`` over the same tensor, measured right
before it) for ``kl_entropy`` and ``entropy_window`` at three spike densities: ``sparse``
(divergence ``rand**8``, the batch above), ``dense`` (``rand**4``) and ``real`` (the per-token
divergence, entropy and mask of ``--trace``, default ``/tmp/defaultrun/samples.jsonl``, laid
end to end and tiled to ``rows x length``; said absent when the file is missing). Goal: every
density <= 2 passes for ``kl_entropy``, <= 3 for ``entropy_window``.
"""

from __future__ import annotations

import argparse
import json
import statistics
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
    gear_segments,
    get_estimator,
    grpo_advantages,
)


def make_batch(rows: int, length: int, seed: int = 0, power: float = 8.0) -> CreditBatch:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (rows,), generator=generator)
    positions = torch.arange(length)
    mask = (positions[None, :] < lengths[:, None]).float()
    starts = lengths // 3
    obs = (positions[None, :] >= starts[:, None]) & (positions[None, :] < starts[:, None] + 64)
    mask[obs] = 0.0
    # sparse spikes over a low floor, like real reverse-KL traces
    divergence = torch.rand(rows, length, generator=generator) ** power * 3.0
    entropy = torch.rand(rows, length, generator=generator) * 2.5
    rewards = torch.randint(0, 2, (rows,), generator=generator).float()
    return CreditBatch(rewards=rewards, group_ids=[i // 8 for i in range(rows)], mask=mask,
                       divergence=divergence, entropy=entropy)


def trace_batch(path: Path, rows: int, length: int) -> CreditBatch | None:
    """The per-token divergence, entropy and mask of every sample in ``path`` (JSON lines), laid
    end to end and tiled to ``[rows, length]``; None when the file is absent or holds none."""
    if not path.exists():
        return None
    div: list[float] = []
    ent: list[float] = []
    msk: list[float] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        sample = json.loads(line)
        if not {"divergence", "entropy", "mask"} <= sample.keys():
            continue
        div.extend(float(x) for x in sample["divergence"])
        ent.extend(float(x) for x in sample["entropy"])
        msk.extend(float(x) for x in sample["mask"])
    if not div:
        return None
    reps = -(-rows * length // len(div))

    def tile(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).repeat(reps)[: rows * length].reshape(
            rows, length).contiguous()

    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (rows,), generator=generator).float()
    return CreditBatch(rewards=rewards, group_ids=[i // 8 for i in range(rows)], mask=tile(msk),
                       divergence=tile(div), entropy=tile(ent))


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
    parser.add_argument("--trace", type=Path, default=Path("/tmp/defaultrun/samples.jsonl"))
    parser.add_argument("--passes-only", action="store_true",
                        help="print only the density table (issue 15)")
    args = parser.parse_args()
    if not args.passes_only:
        main_table(args)
    passes_table(args)


def passes_table(args: argparse.Namespace) -> None:
    """``gear_advantages`` in elementwise passes at three spike densities (issue 15)."""
    batches: dict[str, CreditBatch | None] = {
        "sparse (rand**8)": make_batch(args.rows, args.length, power=8.0),
        "dense (rand**4)": make_batch(args.rows, args.length, power=4.0),
        "real trace": trace_batch(args.trace, args.rows, args.length),
    }
    modes = ("kl_entropy", "entropy_window")
    goals = {"kl_entropy": 2.0, "entropy_window": 3.0}
    print(f"gear_advantages on {args.rows} x {args.length}, in elementwise passes "
          f"(goal: kl_entropy <= 2, entropy_window <= 3); numba threads "
          f"{numba.get_num_threads()}")
    print(f"{'density':<20}{'onsets/1k tok':>14}{'elementwise ms':>16}"
          + "".join(f"{m + ' ms':>20}{'passes':>8}" for m in modes))
    for name, batch in batches.items():
        if batch is None:
            print(f"{name:<20} absent ({args.trace} not found or holds no per-token traces)")
            continue
        advantages = grpo_advantages(batch.rewards, batch.group_ids)
        assert batch.divergence is not None and batch.entropy is not None
        onsets = gear_segments(batch.divergence, batch.entropy, batch.mask, GEARConfig())
        positions = torch.arange(args.length)[None, :]
        starts = int(((onsets == positions) & (batch.mask > 0)).sum())
        density = 1e3 * starts / max(1, int(batch.mask.sum()))
        base = median_seconds(lambda b=batch, a=advantages: a[:, None] * b.mask, args.repeats)
        row = f"{name:<20}{density:>14.1f}{base * 1e3:>16.1f}"
        for mode in modes:
            config = GEARConfig(segmentation=mode)
            seconds = median_seconds(
                lambda b=batch, a=advantages, c=config: gear_advantages(
                    a, b.divergence, b.entropy, b.mask, c), args.repeats)
            flag = "" if seconds / base <= goals[mode] else "!"
            row += f"{seconds * 1e3:>20.1f}{seconds / base:>7.2f}{flag or ' '}"
        print(row)


def main_table(args: argparse.Namespace) -> None:

    batch = make_batch(args.rows, args.length)
    policy = int(batch.mask.sum())
    print(f"batch: {args.rows} x {args.length} ({policy / batch.mask.numel():.0%} policy tokens), "
          f"torch threads {torch.get_num_threads()}, numba threads {numba.get_num_threads()}")
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
        print(f"GEAR / verl GRPO = {ratio:.2f} (goal <= 1.5): {verdict}")


if __name__ == "__main__":
    main()
