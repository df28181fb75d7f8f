"""How a long-running command stops: a stop signal is Ctrl-C.

``kill``, ``timeout``, a CI cancel and a cluster scheduler send SIGTERM; a closed terminal sends
SIGHUP. Python's default for both is to die on the spot, skipping every ``finally`` and every
``except KeyboardInterrupt`` a command has for stopping cleanly (a checkpoint kept, a study's
running cells stopped, a verl job's process group and shared memory removed). Inside
:func:`stop_signals` both raise :class:`StopSignal`, a ``KeyboardInterrupt``, so each command's
one Ctrl-C path serves every way of being told to stop. Only the first signal raises: a second
one must not break off the clean-up the first began.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignal", "exit_code", "stop_signals"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """A stop signal (:data:`STOP_SIGNALS`) reached the process."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_code(stop: BaseException) -> int:
    """The shell's exit status for a command stopped by ``stop``: 128 + the signal's number
    (143 for SIGTERM), 130 for Ctrl-C."""
    return 128 + stop.signum if isinstance(stop, StopSignal) else 130


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn :data:`STOP_SIGNALS` into :class:`StopSignal` while the block runs (main thread
    only: Python runs signal handlers there; elsewhere nothing changes). The previous handlers
    come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping: list[int] = []

    def stop(signum: int, _frame: Any) -> None:
        if not stopping:
            stopping.append(signum)
            raise StopSignal(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
