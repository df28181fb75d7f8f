"""Resident-memory readings of this process from ``/proc`` (Linux), shared by the memory
benchmarks: ``VmRSS`` (now) and ``VmHWM`` (the peak since the last reset), and the reset.

``/proc/self/clear_refs`` <- 5 resets the kernel's high-water mark to the current resident
set. It also resets ``ru_maxrss``, so ``/usr/bin/time``'s "maximum resident set size" is wrong
for a process that uses it."""

from __future__ import annotations

from gear_rl.train.memory import status_bytes as _status_bytes


def status_bytes(field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``, ...) of ``/proc/self/status`` in bytes (the trainer's
    reader; here a missing field is an error: these benchmarks need Linux)."""
    value = _status_bytes(field)
    if value is None:
        raise RuntimeError(f"{field} not in /proc/self/status (these benchmarks need Linux)")
    return value


def reset_peak() -> None:
    """Reset ``VmHWM`` to the current resident set."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
