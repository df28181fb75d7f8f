"""Resident-memory readings of this process from ``/proc`` (Linux), shared by the memory
benchmarks: ``VmRSS`` (now) and ``VmHWM`` (the peak since the last reset), and the reset.

``/proc/self/clear_refs`` <- 5 resets the kernel's high-water mark to the current resident
set. It also resets ``ru_maxrss``, so ``/usr/bin/time``'s "maximum resident set size" is wrong
for a process that uses it."""

from __future__ import annotations


def status_bytes(field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``, ...) of ``/proc/self/status`` in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Reset ``VmHWM`` to the current resident set."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
