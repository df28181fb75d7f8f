"""The project's one seed derivation: every random stream of a run (the step's problems, the
rollout's sampling, the update's shuffle, the credit check's draws) is seeded from the run's
seed and the stream's coordinates, so that a resumed run or check draws what an uninterrupted
one would."""

from __future__ import annotations

__all__ = ["derive_seed", "sequence_seed"]


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from ``parts`` (e.g. ``(seed, stream, step)``): a multiply-add chain
    (Knuth's MMIX LCG constants) over the parts, so different coordinates give unrelated
    streams and the same coordinates the same stream, on every platform."""
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value * 6364136223846793005 + int(part) + 1442695040888963407) % 2**63
    return value


def sequence_seed(*parts: int) -> int:
    """A 63-bit seed from ``parts`` by numpy's ``SeedSequence`` hashing: the credit check's
    draws (problems, samples, continuations). A second derivation kept on purpose: the credit
    checks committed under ``results/credit_check`` were drawn with it, and moving the check to
    :func:`derive_seed` would redraw every problem and continuation of a rerun. New streams use
    :func:`derive_seed`."""
    import numpy as np

    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0]
               >> np.uint64(1))
