"""``gear-rl demo``: every registered token-level estimator on a synthetic batch, no model."""

from __future__ import annotations

import pytest

from gear_rl.credit.registry import estimator_names, get_estimator
from gear_rl.demo import run_demo


def test_demo_shows_every_outcome_estimator_and_names_the_monte_carlo_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first look at the estimators: each one that credits the outcome gets a row,
    and the Monte-Carlo ones (whose values need a policy's continuations) are named as not shown
    instead of ending the demo with their missing-values error."""
    run_demo(seed=0, batch=8, length=24)
    out = capsys.readouterr().out
    rows = {line.split()[0] for line in out.splitlines()[5:] if line[:1].isalpha()}
    monte_carlo = {name for name in estimator_names(step_level=False)
                   if get_estimator(name).mc_boundaries is not None}
    shown = {name for name in estimator_names(step_level=False)
             if get_estimator(name).uses_reward} - monte_carlo
    assert monte_carlo and shown <= rows and not monte_carlo & rows
    assert f"(not shown: {', '.join(sorted(monte_carlo))}," in out
    assert "GEAR (defaults):" in out and "% of policy tokens in segments" in out
