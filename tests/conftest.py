"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Run a module's torch work on one intra-op thread. Tiny models gain nothing from more,
    and on a shared 2-core machine two OpenMP threads contending with other jobs ran the
    tiny-model tests several times slower. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
