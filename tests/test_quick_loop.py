"""The quick loop's guard (tests/conftest.py): a test in the quick set that starts a process,
runs a model or steps an optimiser fails, so the set cannot grow slow unseen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import QUICK


def test_a_quick_test_may_start_no_process_run_no_model_and_step_no_optimiser(
        request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("quick") is not None
    with pytest.raises(AssertionError, match="quick test starts a process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(AssertionError, match="quick test forks"):
        os.fork()
    layer = torch.nn.Linear(2, 1)
    with pytest.raises(AssertionError, match="quick test runs a model"):
        layer(torch.ones(2))
    optimiser = torch.optim.SGD(layer.parameters(), lr=0.1)
    with pytest.raises(AssertionError, match="quick test steps an optimiser"):
        optimiser.step()


def test_the_guard_is_lifted_outside_the_quick_set() -> None:
    """This test is not in the quick set: processes and models work as usual."""
    assert subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True,
                          text=True, check=True).stdout == "2\n"
    assert torch.nn.Linear(2, 1)(torch.ones(2)).shape == (1,)


def test_the_quick_set_names_existing_files() -> None:
    here = os.path.dirname(__file__)
    assert [name for name in QUICK if not os.path.exists(os.path.join(here, name))] == []
