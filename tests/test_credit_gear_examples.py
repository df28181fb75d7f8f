"""GEAR worked by hand, step by step (docs/design.md, "GEAR, as this project specifies it")."""

from __future__ import annotations

import pytest
import torch

from gear_rl.credit import (
    GEARConfig,
    gear_advantages,
    gear_advantages_reference,
    gear_segments,
    gear_weights,
)


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# Example 1: an observation span (positions 3-4) inside a segment, then a segment that runs to
# the end. Policy divergences 0, 2, .5, .4, .2, 1 -> min 0, max 2 (the observations' 9.0 is
# ignored) -> n = 0, 1, .25, _, _, .2, .1, .5. Onset at t=1 (n=1 > 0.1), H_s = 0.5 so the
# segment ends at the first later policy token with H > 0.75: t=3,4 are skipped (their H = 5
# would otherwise end it), t=5 has 0.7, t=6 has 0.9 -> ends at 6 (inclusive). The scan resumes
# at t=7: n = .5 opens a segment that runs to the end.
DIV1 = [[0.0, 2.0, 0.5, 9.0, 9.0, 0.4, 0.2, 1.0]]
ENT1 = [[1.0, 0.5, 0.6, 5.0, 5.0, 0.7, 0.9, 0.2]]
MASK1 = [[1, 1, 1, 0, 0, 1, 1, 1]]
ONSETS1 = [-1, 1, 1, -1, -1, 1, 1, 7]


def example1(advantage: float, config: GEARConfig = GEARConfig(preset="paper")):  # noqa: B008
    return (torch.tensor([advantage]), t(DIV1), t(ENT1), t(MASK1), config)


def test_segments_skip_observation_span_and_run_to_the_end() -> None:
    _, div, ent, mask, config = example1(1.0)
    assert gear_segments(div, ent, mask, config)[0].tolist() == ONSETS1


def test_positive_advantage_down_weights_the_departure() -> None:
    # scores u = 0, 1, 1, _, _, 1, 1, .5; A > 0: w = 1 - u; W = w + 0.5 (alpha 1, beta 0.5)
    out = gear_advantages(*example1(2.0))
    assert out[0].tolist() == pytest.approx([3.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 2.0])


def test_negative_advantage_up_weights_the_departure() -> None:
    # A < 0: w = u -> W = .5, 1.5, 1.5, _, _, 1.5, 1.5, 1.0; times A = -2
    out = gear_advantages(*example1(-2.0))
    assert out[0].tolist() == pytest.approx([-1.0, -3.0, -3.0, 0.0, 0.0, -3.0, -3.0, -2.0])


def test_zero_advantage_gives_unit_weight_and_zero_output() -> None:
    args = example1(0.0)
    assert gear_weights(*args)[0].tolist() == pytest.approx([1, 1, 1, 0, 0, 1, 1, 1])
    assert torch.equal(gear_advantages(*args), torch.zeros(1, 8))


def test_sign_unaware_always_down_weights() -> None:
    out = gear_advantages(*example1(-2.0, GEARConfig(preset="paper", sign_aware=False)))
    assert out[0].tolist() == pytest.approx([-3.0, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0, -2.0])


def test_mean_preserving_keeps_grpo_mass() -> None:
    # W over policy tokens = 1.5, .5, .5, .5, .5, 1.0 -> mean .75 -> W / .75
    out = gear_advantages(*example1(2.0, GEARConfig(mean_preserving=True)))
    expected = [2 * w / 0.75 for w in (1.5, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 1.0)]
    assert out[0].tolist() == pytest.approx(expected)
    assert out[0].sum().item() == pytest.approx(2.0 * 6)


def test_alpha_and_beta() -> None:
    # alpha .4, beta unset -> beta = 1 - .2 = .8; with A > 0, W = .4 (1 - u) + .8
    out = gear_weights(*example1(1.0, GEARConfig(preset="paper", alpha=0.4)))
    assert out[0].tolist() == pytest.approx([1.2, 0.8, 0.8, 0, 0, 0.8, 0.8, 1.0])
    out = gear_weights(*example1(1.0, GEARConfig(preset="paper", alpha=1.0, beta=0.0)))
    assert out[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 0, 0, 0.0, 0.0, 0.5])


def test_onset_with_zero_entropy_ends_at_first_positive_entropy() -> None:
    # onset t=1 has H = 0, so any later H > 0 ends it: t=2 (H = 0) stays in, t=3 ends it.
    div = t([[0.0, 1.0, 0.0, 0.0, 0.0]])
    ent = t([[0.3, 0.0, 0.0, 1e-3, 0.5]])
    mask = torch.ones(1, 5)
    assert gear_segments(div, ent, mask)[0].tolist() == [-1, 1, 1, 1, -1]


def test_segment_to_last_policy_token_before_padding() -> None:
    div = t([[3.0, 1.0, 1.0, 1.0, 0.0, 0.0]])  # policy min 1, max 3 -> n = 1, 0, 0, 0
    ent = t([[2.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    mask = t([[1, 1, 1, 1, 0, 0]])
    assert gear_segments(div, ent, mask)[0].tolist() == [0, 0, 0, 0, -1, -1]
    out = gear_advantages(torch.tensor([4.0]), div, ent, mask, GEARConfig(preset="paper"))
    assert out[0].tolist() == pytest.approx([2.0, 2.0, 2.0, 2.0, 0.0, 0.0])  # W = .5 everywhere
    # mean_preserving (the default): W / mean(W) = 1 everywhere, GRPO's advantage
    out = gear_advantages(torch.tensor([4.0]), div, ent, mask)
    assert out[0].tolist() == pytest.approx([4.0, 4.0, 4.0, 4.0, 0.0, 0.0])


def test_flat_divergence_normalises_to_zero() -> None:
    div = torch.full((1, 4), 0.7)
    out = gear_advantages(torch.tensor([1.0]), div, torch.ones(1, 4), torch.ones(1, 4),
                          GEARConfig(preset="paper"))
    assert out[0].tolist() == pytest.approx([1.5] * 4)  # u = 0 -> w = 1 -> W = 1.5


def test_all_masked_row_is_zero() -> None:
    div, ent = torch.rand(2, 5), torch.rand(2, 5)
    mask = torch.ones(2, 5)
    mask[1] = 0
    out = gear_advantages(torch.tensor([1.0, -1.0]), div, ent, mask,
                          GEARConfig(mean_preserving=True))
    assert torch.equal(out[1], torch.zeros(5))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(("normalize", "expected"), [
    ("max", [0.25, 0.5, 1.0]),
    ("none", [1.0, 2.0, 4.0]),
    ("minmax", [0.0, 1 / 3, 1.0]),
])
def test_normalize_modes(normalize: str, expected: list[float]) -> None:
    # segmentation none: u = n, and A < 0 makes W = n + 0.5, so the weights show n
    config = GEARConfig(preset="paper", normalize=normalize, segmentation="none")
    w = gear_weights(torch.tensor([-1.0]), t([[1.0, 2.0, 4.0]]), torch.ones(1, 3),
                     torch.ones(1, 3), config)
    assert w[0].tolist() == pytest.approx([n + 0.5 for n in expected])


def test_kl_only_segments_run_spike_to_spike() -> None:
    div = t([[0.0, 0.5, 0.05, 0.0, 1.0, 0.0]])
    ent = torch.ones(1, 6)
    mask = torch.ones(1, 6)
    kl_only = gear_segments(div, ent, mask, GEARConfig(preset="paper", segmentation="kl_only"))
    assert kl_only[0].tolist() == [-1, 1, 1, 1, 4, 4]
    # the default scan never terminates here (flat entropy), so the t=4 spike is inside
    assert gear_segments(div, ent, mask)[0].tolist() == [-1, 1, 1, 1, 1, 1]


def test_entropy_only_onsets_use_normalised_entropy() -> None:
    # normalised H = 0, .111, 1, 0 -> onset t=1; H_s = .2 -> ends at t=2 (H 1.0 > .3).
    # The score is still the divergence: u = n_1 = 1 on t=1..2.
    div = t([[0.0, 1.0, 0.0, 0.0]])
    ent = t([[0.1, 0.2, 1.0, 0.1]])
    mask = torch.ones(1, 4)
    config = GEARConfig(preset="paper", segmentation="entropy_only")
    assert gear_segments(div, ent, mask, config)[0].tolist() == [-1, 1, 1, -1]
    w = gear_weights(torch.tensor([1.0]), div, ent, mask, config)
    assert w[0].tolist() == pytest.approx([1.5, 0.5, 0.5, 1.5])


def test_entropy_window_smooths_termination() -> None:
    div = t([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    ent = t([[1.0, 1.0, 1.7, 1.2, 2.0, 0.1]])
    mask = torch.ones(1, 6)
    # default: t=2 (1.7 > 1.5) ends it
    assert gear_segments(div, ent, mask)[0].tolist() == [0, 0, 0, -1, -1, -1]
    # window 2: means 1.0, 1.35, 1.45, 1.6 -> ends at t=4
    config = GEARConfig(preset="paper", segmentation="entropy_window", window=2)
    assert gear_segments(div, ent, mask, config)[0].tolist() == [0, 0, 0, 0, 0, -1]


def test_token_level_has_no_segments() -> None:
    div, ent, mask = t(DIV1), t(ENT1), t(MASK1)
    config = GEARConfig(preset="paper", segmentation="none")
    assert (gear_segments(div, ent, mask, config) == -1).all()


def test_reference_matches_the_hand_examples() -> None:
    for adv in (2.0, -2.0, 0.0):
        for config in (GEARConfig(preset="paper"), GEARConfig(mean_preserving=True),
                       GEARConfig(preset="paper", segmentation="kl_only")):
            args = example1(adv, config)
            assert torch.allclose(gear_advantages(*args).double(),
                                  gear_advantages_reference(*args), atol=1e-6)


def test_dtypes_devices_and_empty_inputs() -> None:
    args = example1(2.0)
    out64 = gear_advantages(args[0].double(), args[1].double(), args[2].double(), args[3],
                            args[4])
    assert out64.dtype == torch.float64
    bf16 = gear_advantages(args[0], args[1].bfloat16(), args[2].bfloat16(), args[3].bool())
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all()
    empty = gear_advantages(torch.zeros(0), torch.zeros(0, 5), torch.zeros(0, 5),
                            torch.zeros(0, 5))
    assert empty.shape == (0, 5)
    assert gear_advantages(torch.ones(2), torch.zeros(2, 0), torch.zeros(2, 0),
                           torch.zeros(2, 0)).shape == (2, 0)
    noncontig = torch.rand(8, 4).t()
    assert gear_segments(noncontig, noncontig, torch.ones(4, 8)).shape == (4, 8)


@pytest.mark.parametrize(("position", "field", "value", "match"), [
    (3000, "divergence", float("nan"), "divergence contains NaN or inf"),
    (1500, "entropy", float("-inf"), "entropy contains NaN or inf"),
    (2999, "mask", 2.0, "mask must contain only 0 and 1"),
])
def test_bad_value_on_a_long_row_names_it_and_its_row(position: int, field: str, value: float,
                                                      match: str) -> None:
    """Checked at every position (past the last policy token too) before anything is written;
    the first bad token of the row decides what the message names."""
    div, ent, mask = torch.rand(3, 3200), torch.rand(3, 3200), torch.ones(3, 3200)
    mask[:, 2000:] = 0
    {"divergence": div, "entropy": ent, "mask": mask}[field][2, position] = value
    for segmentation in ("kl_entropy", "entropy_window"):
        with pytest.raises(ValueError, match=f"{match} \\(row 2"):
            gear_advantages(torch.ones(3), div, ent, mask,
                            GEARConfig(preset="paper", segmentation=segmentation))
    ent[2, position - 1] = float("nan")  # an earlier bad token decides
    with pytest.raises(ValueError, match="entropy contains NaN or inf \\(row 2"):
        gear_segments(div, ent, mask)


def test_skip_first_keeps_the_first_tokens_from_opening_and_from_the_range() -> None:
    """skip_first=1: the first policy token's large divergence (the pilot's first-token
    segment) no longer opens a segment that runs to the end, nor squeezes the other tokens'
    normalised divergence; a masked position before it does not count as a policy token."""
    div = torch.tensor([[9.0, 5.0, 0.1, 0.15, 1.0, 0.1]])
    ent = torch.tensor([[1.0, 3.0, 2.0, 2.0, 1.0, 2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    plain = GEARConfig(preset="paper")
    skip = GEARConfig(preset="paper", skip_first=1)
    # without: token 1 (n = 1) opens a segment whose threshold 4.5 no later entropy exceeds
    assert gear_segments(div, ent, mask, plain).tolist() == [[-1, 1, 1, 1, 1, 1]]
    # with: token 1 takes the row's other minimum (0.1): token 4 (n = 1) opens, and token 5
    # (entropy 2.0 > 1.5 * 1.0) closes, inclusive
    assert gear_segments(div, ent, mask, skip).tolist() == [[-1, -1, -1, -1, 4, 4]]
    weights = gear_weights(torch.ones(1), div, ent, mask, skip)[0].tolist()
    n = [0.0, 0.0, 0.0, 0.05 / 0.9, 1.0, 1.0]  # (d - 0.1) / (1.0 - 0.1); 5 carries 4's
    assert weights == pytest.approx([0.0] + [1.5 - u for u in n[1:]], abs=1e-6)
    assert torch.equal(gear_advantages(torch.ones(1), div, ent, mask, skip),
                       gear_advantages_reference(torch.ones(1), div, ent, mask, skip).float())
    # a row with only skipped policy tokens gets n = 0 there; a bad value there is still found
    all_skipped = GEARConfig(preset="paper", skip_first=9)
    assert gear_weights(-torch.ones(1), div, ent, mask, all_skipped).tolist() == [
        [0.0] + [0.5] * 5]
    div[0, 1] = float("nan")
    with pytest.raises(ValueError, match="divergence contains NaN"):
        gear_advantages(torch.ones(1), div, ent, mask, skip)
    with pytest.raises(ValueError, match="skip_first must be an integer >= 0"):
        GEARConfig(preset="paper", skip_first=-1)
