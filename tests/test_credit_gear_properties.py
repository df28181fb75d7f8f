"""Property tests: the compiled kernel against the plain-Python reference, and GEAR's invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gear_rl.credit import (
    GEARConfig,
    gear_advantages,
    gear_advantages_reference,
    gear_segments,
)
from gear_rl.credit.config import NORMALIZE_MODES, SEGMENTATION_MODES
from gear_rl.credit.gear import skip_first_tokens
from gear_rl.credit.segments import normalize_reference, scan_reference

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    rows = draw(st.integers(1, 4))
    length = draw(st.integers(0, 24))
    # a few distinct magnitudes make ties and flat rows likely, as in real divergences
    value = st.one_of(st.sampled_from([0.0, 0.05, 0.5, 1.0, 3.0]),
                      st.floats(0.0, 20.0, width=32))
    div = torch.tensor(draw(st.lists(st.lists(value, min_size=length, max_size=length),
                                     min_size=rows, max_size=rows)), dtype=torch.float32)
    ent = torch.tensor(draw(st.lists(st.lists(value, min_size=length, max_size=length),
                                     min_size=rows, max_size=rows)), dtype=torch.float32)
    mask = torch.tensor(draw(st.lists(st.lists(st.integers(0, 1), min_size=length,
                                               max_size=length), min_size=rows, max_size=rows)),
                        dtype=torch.float32)
    adv = torch.tensor(draw(st.lists(st.sampled_from([-1.5, -0.3, 0.0, 0.7, 2.0]),
                                     min_size=rows, max_size=rows)), dtype=torch.float32)
    return adv.reshape(rows), div.reshape(rows, length), ent.reshape(rows, length), \
        mask.reshape(rows, length)


configs = st.builds(
    GEARConfig,
    lambda_kl=st.sampled_from([0.0, 0.1, 0.3, 0.9]),
    lambda_h=st.sampled_from([1.0, 1.2, 1.5, 3.0]),  # GEARConfig refuses < 1
    alpha=st.sampled_from([0.5, 1.0, 2.0]),
    beta=st.sampled_from([None, 0.0, 0.3]),
    normalize=st.sampled_from(NORMALIZE_MODES),
    segmentation=st.sampled_from(SEGMENTATION_MODES),
    window=st.integers(1, 5),
    sign_aware=st.booleans(),
    mean_preserving=st.booleans(),
    skip_first=st.sampled_from([0, 0, 1, 3]),
)


def reference_onsets(div: torch.Tensor, ent: torch.Tensor, mask: torch.Tensor,
                     config: GEARConfig) -> list[list[int]]:
    out = []
    div = skip_first_tokens(div, mask, config.skip_first)  # hand-checked in the examples
    for d_row, h_row, m_row in zip(div.double().tolist(), ent.double().tolist(),
                                   mask.int().tolist(), strict=True):
        normalized = normalize_reference(d_row, m_row, config.normalize)
        out.append(scan_reference(normalized, h_row, m_row, config))
    return out


@SETTINGS
@given(batches(), configs)
def test_compiled_scan_equals_reference(batch: tuple[torch.Tensor, ...],
                                        config: GEARConfig) -> None:
    _, div, ent, mask = batch
    assert gear_segments(div, ent, mask, config).tolist() == reference_onsets(div, ent, mask,
                                                                                config)


@SETTINGS
@given(batches(), configs)
def test_compiled_advantages_equal_reference(batch: tuple[torch.Tensor, ...],
                                             config: GEARConfig) -> None:
    out = gear_advantages(*batch, config)
    ref = gear_advantages_reference(*batch, config)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(batches(), configs)
def test_zero_where_masked_and_finite(batch: tuple[torch.Tensor, ...],
                                      config: GEARConfig) -> None:
    adv, div, ent, mask = batch
    out = gear_advantages(adv, div, ent, mask, config)
    assert torch.isfinite(out).all()
    assert (out[mask == 0] == 0).all()
    onsets = gear_segments(div, ent, mask, config)
    assert (onsets[mask == 0] == -1).all()
    # every onset is a policy token that points at itself, and segments point backwards
    positions = torch.arange(div.shape[1]).expand_as(onsets)
    inside = onsets >= 0
    assert (onsets[inside] <= positions[inside]).all()
    for row, col in zip(*torch.nonzero(inside, as_tuple=True), strict=True):
        s = onsets[row, col]
        assert onsets[row, s] == s and mask[row, s] == 1


@SETTINGS
@given(batches(), st.sampled_from(SEGMENTATION_MODES))
def test_sign_aware_direction(batch: tuple[torch.Tensor, ...], segmentation: str) -> None:
    """A high-divergence onset (score > 0.5) gets W < 1 when A > 0 and W > 1 when A < 0: the
    paper's W (``preset=paper``; the default ``mean_preserving`` rescales each row by 1/mean)."""
    _, div, ent, mask = batch
    config = GEARConfig(preset="paper", segmentation=segmentation, lambda_kl=0.5)
    rows = div.shape[0]
    pos = gear_advantages(torch.ones(rows), div, ent, mask, config)
    neg = gear_advantages(-torch.ones(rows), div, ent, mask, config)
    onsets = gear_segments(div, ent, mask, config)
    positions = torch.arange(div.shape[1]).expand_as(onsets)
    is_onset = onsets == positions
    if segmentation == "entropy_only":
        return  # onsets come from entropy there; their divergence score may be anything
    assert (pos[is_onset] < 1).all()
    assert (-neg[is_onset] > 1).all()
    # with alpha = 1 the two weights are mirror images around 1
    assert torch.allclose((pos - neg)[mask == 1], torch.full_like(pos[mask == 1], 2.0))


def spiky_rows(rows: int, length: int, spikes: float, bursts: float, seed: int,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """Long rows with a chosen segment density: divergence spikes open segments, entropy bursts
    close them (as in benchmarks/credit_speed.py), with right padding, an observation span, a
    few negative divergences (k1) and entropies, and exact zeros of both signs."""
    generator = torch.Generator().manual_seed(seed)
    kind = torch.rand(rows, length, generator=generator)
    spike = kind < spikes
    burst = (kind >= spikes) & (kind < spikes + bursts)
    uniform = torch.rand(rows, length, generator=generator)
    div = torch.where(spike, 1.0 + 2.0 * uniform, 0.2 * uniform - 0.02)
    uniform = torch.rand(rows, length, generator=generator)
    ent = torch.where(burst, 2.0 + 0.5 * uniform, 0.8 + 0.4 * uniform)
    zeros = torch.rand(rows, length, generator=generator) < 0.01
    div[zeros], ent[zeros] = 0.0, 0.0
    div[:, 1::97], ent[:, 2::89] = -0.0, -0.0
    ent[:, 5::211] = -0.3
    mask = torch.ones(rows, length)
    for row in range(rows):
        end = length - 37 * row
        mask[row, end:] = 0  # right padding
        mask[row, end // 3: end // 3 + 50] = 0  # observation span inside a segment
    adv = torch.tensor([(-1.0) ** row * (row % 3) for row in range(rows)])
    return adv.to(dtype), div.to(dtype), ent.to(dtype), mask


LONG_CASES = [  # (spike rate, burst rate): sparse, dense (most tokens inside), flicker
    (0.004, 0.1), (0.3, 0.08), (0.5, 0.5)]


@pytest.mark.parametrize("segmentation", SEGMENTATION_MODES)
@pytest.mark.parametrize(("spikes", "bursts"), LONG_CASES)
def test_long_rows_equal_reference(segmentation: str, spikes: float, bursts: float) -> None:
    """Long rows with several policy runs, at sparse and dense segment densities: onsets
    identical to the reference, advantages within 1e-5."""
    adv, div, ent, mask = spiky_rows(4, 2600, spikes, bursts, seed=int(spikes * 1000))
    for normalize in NORMALIZE_MODES:
        for window, mean_preserving in ((8, False), (3, True)):
            config = GEARConfig(segmentation=segmentation, normalize=normalize, window=window,
                                mean_preserving=mean_preserving)
            assert gear_segments(div, ent, mask, config).tolist() == reference_onsets(
                div, ent, mask, config)
            out = gear_advantages(adv, div, ent, mask, config)
            ref = gear_advantages_reference(adv, div, ent, mask, config)
            assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 2, 5, 8, 9, 12, 16, 17])
def test_entropy_window_any_window_size(window: int) -> None:
    """Window sizes around and past eight, powers of two or not, give the reference's
    onsets."""
    _, div, ent, mask = spiky_rows(3, 1500, 0.3, 0.3, seed=window)
    for lambda_h in (1.0, 1.2, 1.5):
        config = GEARConfig(segmentation="entropy_window", window=window, lambda_h=lambda_h)
        assert gear_segments(div, ent, mask, config).tolist() == reference_onsets(
            div, ent, mask, config)


@pytest.mark.parametrize("lambda_h", [1.0, 1.5])
@pytest.mark.parametrize("segmentation", ["kl_entropy", "entropy_only", "entropy_window"])
def test_float64_and_odd_thresholds_equal_reference(lambda_h: float, segmentation: str) -> None:
    """float64 inputs, and the lowest threshold GEARConfig allows (1: any entropy rise), where
    -0.0 and 0.0 entropies must compare equal."""
    adv, div, ent, mask = spiky_rows(3, 1300, 0.3, 0.08, seed=7, dtype=torch.float64)
    config = GEARConfig(segmentation=segmentation, lambda_h=lambda_h)
    assert gear_segments(div, ent, mask, config).tolist() == reference_onsets(div, ent, mask,
                                                                                config)
    out = gear_advantages(adv, div, ent, mask, config)
    assert out.dtype == torch.float64
    assert torch.allclose(out, gear_advantages_reference(adv, div, ent, mask, config),
                          rtol=1e-12, atol=1e-12)


_THREADS_SCRIPT = """
import numba, torch
torch.set_num_threads(1)
x = torch.randn(300, 300)
_ = x @ x  # torch's OpenMP pool in use
from gear_rl.credit import CreditBatch, get_estimator
g = torch.Generator().manual_seed(0)
shape = (16, 40)
batch = CreditBatch(rewards=torch.rand(16, generator=g).round(),
                    group_ids=[i // 4 for i in range(16)], mask=torch.ones(shape),
                    divergence=torch.rand(shape, generator=g),
                    entropy=torch.rand(shape, generator=g))
assert torch.get_num_threads() == 1  # asking torch its count (as the trainer's metrics do)
estimator = get_estimator("gear")  # numba's threading layer starts in the kernel's first call
estimator(batch, estimator.make_config())
print(torch.get_num_threads(), numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS)
"""


def test_the_kernel_leaves_torch_thread_count_alone() -> None:
    """numba's parallel region shares the OpenMP runtime with torch: in a process whose torch
    pool was in use, starting numba's threading layer (with its default, every core) raised
    torch's thread count to every core for the rest of the process, so a ``threads=1``
    trainer computed on two threads after its first GEAR step (seen in a fresh interpreter,
    so the check runs in one). The kernel now runs within torch's count and leaves it, and
    numba's own, as they were."""
    import os
    import subprocess
    import sys

    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: numba's default cannot exceed torch's thread count")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "True"]
