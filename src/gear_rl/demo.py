"""A look at the credit functions on a synthetic batch (``gear-rl demo``)."""

from __future__ import annotations

import torch

from gear_rl.credit import (
    CreditBatch,
    GEARConfig,
    gear_segments,
    gear_weights,
    get_estimator,
    grpo_advantages,
)
from gear_rl.credit.registry import estimator_names


def synthetic_batch(batch: int, length: int, seed: int) -> CreditBatch:
    """Groups of 4 trajectories with sparse divergence spikes, entropy, ragged lengths and an
    observation span (mask 0) in every trajectory. Shapes: ``[batch, length]``."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    obs_start = length // 3
    mask[:, obs_start:obs_start + 3] = 0.0
    divergence = torch.rand(batch, length, generator=generator) ** 6 * 2.0
    entropy = torch.rand(batch, length, generator=generator) * 2.0
    student = -torch.rand(batch, length, generator=generator) * 2.0
    return CreditBatch(
        rewards=torch.randint(0, 2, (batch,), generator=generator).float(),
        group_ids=[i // 4 for i in range(batch)],
        mask=mask,
        divergence=divergence,
        entropy=entropy,
        student_logprobs=student,
        teacher_logprobs=student - divergence,
    )


def run_demo(seed: int = 0, batch: int = 8, length: int = 24) -> None:
    """Run every registered estimator on a synthetic batch and show GEAR's per-token credit."""
    data = synthetic_batch(batch, length, seed)
    assert data.divergence is not None and data.entropy is not None  # synthetic_batch sets both
    advantages = grpo_advantages(data.rewards, data.group_ids)
    print(f"synthetic batch: {batch} trajectories in groups of 4, up to {length} tokens, "
          f"an observation span at t={length // 3}..{length // 3 + 2}")
    print(f"rewards    {data.rewards.tolist()}")
    print(f"GRPO A_i   {[round(a, 3) for a in advantages.tolist()]}\n")

    print("per-token advantage relative to GRPO's A_i, averaged over policy tokens:")
    print(f"{'estimator':<22}{'mean|Ahat|':>11}{'Ahat/A (A>0)':>14}{'Ahat/A (A<0)':>14}")
    policy = data.mask.bool()
    skipped = []
    for name in estimator_names(step_level=False):
        estimator = get_estimator(name)
        if not estimator.uses_reward:
            continue
        if estimator.mc_boundaries is not None:
            skipped.append(name)  # its values come from the policy's continuations
            continue
        out = estimator(data)
        ratio = torch.where(policy, out / advantages[:, None].where(advantages[:, None] != 0,
                                                                     torch.ones(1)), 0.0)
        pos = policy & (advantages[:, None] > 0)
        neg = policy & (advantages[:, None] < 0)
        print(f"{name:<22}{out[policy].abs().mean().item():>11.3f}"
              f"{ratio[pos].mean().item():>14.3f}{ratio[neg].mean().item():>14.3f}")
    if skipped:
        print(f"(not shown: {', '.join(skipped)}, whose Monte-Carlo values come from a policy's "
              "continuations: gear-rl train's values phase)")

    config = GEARConfig()
    onsets = gear_segments(data.divergence, data.entropy, data.mask, config)
    weights = gear_weights(advantages, data.divergence, data.entropy, data.mask, config)
    in_segments = (onsets[policy] >= 0).float().mean().item()
    print(f"\nGEAR (defaults): {in_segments:.0%} of policy tokens in segments")
    for row in (int(advantages.argmax()), int(advantages.argmin())):
        print(f"\ntrajectory {row}, A = {advantages[row].item():+.3f} "
              "(t, divergence, entropy, onset, W; '.' = observation/padding)")
        cells = []
        for t in range(length):
            if not policy[row, t]:
                cells.append(f"{t:>2} .")
                continue
            onset = int(onsets[row, t])
            mark = "-" if onset < 0 else ("S" if onset == t else "|")
            cells.append(f"{t:>2} d={data.divergence[row, t].item():.2f} "
                         f"H={data.entropy[row, t].item():.2f} {mark} "
                         f"W={weights[row, t].item():.2f}")
        for start in range(0, len(cells), 4):
            print("   ".join(f"{c:<30}" for c in cells[start:start + 4]).rstrip())
