"""The process of one study cell: ``python -m gear_rl.study.cell PARENT_PID train ARGS...`` (a
verl study's: ``PARENT_PID verl ARGS...``, which becomes
``python -m gear_rl.study.verl_job run PARENT_PID ARGS...``).

It asks Linux to kill it when its parent, the study runner, dies
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``), then replaces itself with ``python -m gear_rl.cli train
ARGS...`` (``os.execv``: same process, and the death signal survives the exec): a study killed
with SIGKILL takes its running cells with it, so a rerun finds their run directories unlocked
and resumes them, instead of racing orphans that keep training into the same folders. The exec
keeps ``study`` below ``cli`` in the import order (``cli`` imports ``study``, never the reverse).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Receive ``signum`` (SIGKILL) when the parent process ends (Linux; elsewhere nothing is
    arranged), and exit at once if ``parent`` already ended before the request was made."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    """``PARENT_PID COMMAND ARGS...``: becomes the ``gear-rl`` command (returns only on a usage
    error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or not args[0].isdigit():
        print("usage: python -m gear_rl.study.cell PARENT_PID COMMAND [ARGS...]",
              file=sys.stderr)
        return 2
    die_with_parent(int(args[0]))
    sys.stdout.flush()
    sys.stderr.flush()
    if args[1] == "verl":  # a verl study's cell: a verl job (it asks for SIGTERM instead, so
        # the job's own clean-up runs: gear_rl.study.verl_job)
        os.execv(sys.executable, [sys.executable, "-m", "gear_rl.study.verl_job",
                                  "run", args[0], *args[2:]])
    os.execv(sys.executable, [sys.executable, "-m", "gear_rl.cli", *args[1:]])


if __name__ == "__main__":
    sys.exit(main())
