"""``scripts/verl_cpu.sh`` stops its whole job however it is told to (issue 56): SIGTERM and SIGHUP
(``kill``, ``timeout``, a CI cancel, a scheduler, a closed terminal) as Ctrl-C does, and
``--timeout`` on the clock even when the job prints nothing. A stand-in job (a real process
group: a shell that starts a grandchild, makes a shared-memory segment and then sleeps
silently) is run by the real :func:`gear_rl.integrations.verl.cpu_job.run_job` in a real
subprocess, and signalled as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")

RUNNER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gear_rl.integrations.verl.cpu_job import JobPlan, run_job
    marker, timeout = sys.argv[1], float(sys.argv[2])
    script = (f"sleep 300 & echo $! > {marker}.child; touch /dev/shm/psm_{Path(marker).name}; "
              "echo started; exec sleep 300")
    plan = JobPlan(command=["bash", "-c", script], env=dict(__import__("os").environ),
                   workdir=Path(marker).parent, setting="math")
    sys.exit(run_job(plan, timeout_s=timeout if timeout > 0 else None))
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _start(tmp_path: Path, timeout: float) -> tuple[subprocess.Popen[str], Path]:
    marker = tmp_path / f"job{os.getpid()}{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(marker), str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (marker.with_suffix(".child").exists()
               and Path(f"/dev/shm/psm_{marker.name}").exists()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stand-in job never started"
        time.sleep(0.1)
    return proc, marker


def _left_nothing(marker: Path) -> None:
    child = int(marker.with_suffix(".child").read_text())
    deadline = time.monotonic() + 15
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the job's grandchild outlived the stop"
    assert not Path(f"/dev/shm/psm_{marker.name}").exists(), "its shared memory was left"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_whole_job_and_says_so(tmp_path, sig) -> None:
    proc, marker = _start(tmp_path, timeout=0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"{signal.Signals(sig).name}: stopping the job" in err
    _left_nothing(marker)


def test_the_timeout_stops_a_silent_job_on_time(tmp_path) -> None:
    proc, marker = _start(tmp_path, timeout=3)
    started = time.monotonic()  # the job is running (importing verl came before)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 124, err
    assert "timed out after 3 s" in err
    # on time: the job printed one line and then nothing; before, the timeout was only
    # checked at the job's next line, 300 s away
    assert time.monotonic() - started < 60
    _left_nothing(marker)
