"""``release_free_memory``: the trainer hands the heap's free pages back between phases."""

from __future__ import annotations

import ctypes
import sys

import pytest

from gear_rl.train.runtime import release_free_memory, status_bytes


def _rss_mb() -> float:
    return (status_bytes("VmRSS") or 0) / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap only")
def test_freed_heap_pages_go_back_to_the_os() -> None:
    """Blocks under glibc's mmap threshold live on the heap; freeing them (with a live block
    above them, so free cannot shrink the heap's top itself) leaves their pages resident until
    release_free_memory returns them."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 3200  # 200 MiB in blocks far below the mmap threshold
    release_free_memory()
    blocks = []
    for _ in range(count):
        block = libc.malloc(size)
        assert block
        ctypes.memset(block, 1, size)  # touch every page: resident
        blocks.append(block)
    guard = libc.malloc(size)  # keeps the heap's top in use
    ctypes.memset(guard, 1, size)
    for block in blocks:
        libc.free(block)
    held = _rss_mb()
    release_free_memory()
    released = _rss_mb()
    libc.free(guard)
    assert held - released > 150, (held, released)
