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
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numba
import numpy as np
import torch

from gear_rl.credit import CreditBatch, GEARConfig, gear_advantages, get_estimator, grpo_advantages


def make_batch(rows: int, length: int, seed: int = 0) -> CreditBatch:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (rows,), generator=generator)
    positions = torch.arange(length)
    mask = (positions[None, :] < lengths[:, None]).float()
    starts = lengths // 3
    obs = (positions[None, :] >= starts[:, None]) & (positions[None, :] < starts[:, None] + 64)
    mask[obs] = 0.0
    # sparse spikes over a low floor, like real reverse-KL traces
    divergence = torch.rand(rows, length, generator=generator) ** 8 * 3.0
    entropy = torch.rand(rows, length, generator=generator) * 2.5
    rewards = torch.randint(0, 2, (rows,), generator=generator).float()
    return CreditBatch(rewards=rewards, group_ids=[i // 8 for i in range(rows)], mask=mask,
                       divergence=divergence, entropy=entropy)


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
    args = parser.parse_args()

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
