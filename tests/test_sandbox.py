"""``PythonSandbox``: API, limits, pool behaviour, and the reduced-isolation modes.

The hostile-program corpus is in ``test_sandbox_security.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gear_rl.agent.tools import GUARANTEES, LIMIT_NAMES, PythonSandbox, SandboxResult

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[1]
# The checkout is never in the sandbox's root: a write there finds no directory, or (where the
# venv inside it puts a bare skeleton of its path in the root) a read-only one.
REPO_WRITE_ERRORS = ("Read-only file system", "FileNotFoundError")


def _processes_of(uids: set[int]) -> list[int]:
    """Live (non-zombie) processes owned by ``uids``. A killed process whose parent died waits
    as a zombie until pid 1 reaps it; it holds nothing and runs nothing."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid not in uids:
                    continue
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found.append(int(name))
    return found


def _mountinfo() -> list[str]:
    return [" ".join(line.split()[3:5]) for line in Path("/proc/self/mountinfo").read_text()
            .splitlines()]


@pytest.fixture(scope="module")
def sandbox():
    with PythonSandbox(workers=2, timeout_s=3.0, memory_mb=256) as pool:
        yield pool


def test_public_api_and_result_fields(sandbox: PythonSandbox):
    result = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    assert isinstance(result, SandboxResult)
    assert (result.stdout, result.stderr, result.exit_code, result.limit_hit) == (
        "out\n", "err\n", 0, None)
    assert 0 < result.duration_s < 3 and result.ok
    failed = sandbox.run("import sys\nsys.exit(4)")
    assert failed.exit_code == 4 and not failed.ok and failed.limit_hit is None
    error = sandbox.run("1 / 0")
    assert error.exit_code == 1 and error.stderr.splitlines()[-1] == (
        "ZeroDivisionError: division by zero")
    assert 'File "<sandbox>", line 1' in error.stderr
    assert "_sandbox_worker" not in error.stderr  # the traceback shows the code only


def test_code_sees_a_fresh_main_module_and_scratch_directory(sandbox: PythonSandbox):
    result = sandbox.run(
        "import os, sys\nprint(__name__, os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])"
        "\nopen('f.txt', 'w').write('data')\nprint(open('f.txt').read(), sorted(os.environ))\n"
        "print('x' in globals())"
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "__main__ True", result
    assert lines[1].startswith("data ['HOME', 'LANG',"), result
    assert lines[2] == "False"
    assert sandbox.run("x = 1").ok and sandbox.run("print('x' in globals())").stdout == "False\n"


def test_standard_library_and_installed_packages_import(sandbox: PythonSandbox):
    result = sandbox.run("import decimal, fractions, json, sympy\nprint(sympy.factor('x**2-1'))")
    assert result.stdout == "(x - 1)*(x + 1)\n", result


def test_what_the_code_defines_pickles_through_its_main_module(sandbox: PythonSandbox):
    """The code's namespace is the ``__main__`` module in ``sys.modules``, as under
    ``python -c``: ``multiprocessing.Pool.map`` and ``ProcessPoolExecutor`` on a function the
    code defines, pickling its classes and resolving its string annotations all work."""
    result = sandbox.run(
        "import dataclasses, pickle, sys, typing\n"
        "from concurrent.futures import ProcessPoolExecutor\nfrom multiprocessing import Pool\n"
        "def square(x):\n    return x * x\n"
        "class Point:\n    def __init__(self, x):\n        self.x = x\n"
        "@dataclasses.dataclass\nclass Pair:\n    a: 'int'\n    b: 'Point'\n"
        "if __name__ == '__main__':\n"
        "    with Pool(2) as pool:\n        print(pool.map(square, range(5)))\n"
        "    with ProcessPoolExecutor(2) as executor:\n"
        "        print(list(executor.map(square, range(4))))\n"
        "    print(pickle.loads(pickle.dumps(Point(3))).x, typing.get_type_hints(Pair)['b'])\n"
        "    print(sys.modules['__main__'].square is square)\n")
    assert result.stdout.splitlines() == [
        "[0, 1, 4, 9, 16]", "[0, 1, 4, 9]", "3 <class '__main__.Point'>", "True"], result
    assert result.ok, result


def test_a_failed_set_up_is_a_sandbox_error():
    """The child's set-up still reports its own failure (a file limit above what the kernel
    allows), before the code runs and on the channel the code never gets."""
    with PythonSandbox(workers=1, timeout_s=3.0, max_open_files=1 << 40) as pool:
        result = pool.run("print('never')")
        assert (result.limit_hit, result.exit_code, result.stdout) == (
            "sandbox_error", 126, ""), result
        assert "sandbox set-up failed" in result.stderr, result


def test_limit_labels_follow_what_the_result_shows(sandbox: PythonSandbox):
    """A limit named by an exception is read from the traceback the result shows (the code has
    no other channel to the worker): the label agrees with stderr and the exit status."""
    bomb = sandbox.run("x = bytearray(1 << 34)")
    assert (bomb.exit_code, bomb.limit_hit) == (1, "memory")
    assert bomb.stderr.splitlines()[-1] == "MemoryError", bomb
    caught = sandbox.run("try:\n    x = bytearray(1 << 34)\nexcept MemoryError:\n"
                         "    print('caught')\n")
    assert (caught.stdout, caught.limit_hit) == ("caught\n", None), caught
    printed = sandbox.run("import sys\nprint('MemoryError', file=sys.stderr)\nsys.exit(1)")
    assert printed.limit_hit == "memory", printed  # indistinguishable from the real one
    assert sandbox.run("import sys\nprint('MemoryError', file=sys.stderr)").limit_hit is None
    threads = sandbox.run(
        "import threading, time\nwhile True:\n"
        "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    # out of processes (32) or out of address space for stacks first: the note says which
    *_, error, note = threads.stderr.splitlines()
    assert error == "RuntimeError: can't start new thread", threads
    assert note.startswith("[sandbox] ") and note.endswith(
        " processes and threads were running (at most 32)"), threads
    tasks = int(note.split()[1])
    assert threads.limit_hit == ("processes" if tasks >= 31 else "memory"), threads


def test_run_many_keeps_order_and_is_thread_safe(sandbox: PythonSandbox):
    codes = [f"print({i} * {i})" for i in range(12)]
    assert [r.stdout for r in sandbox.run_many(codes)] == [f"{i * i}\n" for i in range(12)]
    assert sandbox.run_many([]) == []
    outputs: dict[int, str] = {}

    def call(i: int) -> None:
        outputs[i] = sandbox.run(f"import time\ntime.sleep(0.01)\nprint({i})").stdout

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == {i: f"{i}\n" for i in range(8)}


def test_timeout_per_call_kills_the_process_group(sandbox: PythonSandbox):
    started = time.monotonic()
    result = sandbox.run("import time\nprint('before', flush=True)\ntime.sleep(60)",
                         timeout_s=0.5)
    assert result.limit_hit == "timeout" and result.exit_code == -9
    assert result.stdout == "before\n"
    assert time.monotonic() - started < 5


def test_output_is_truncated_at_the_cap():
    with PythonSandbox(workers=1, timeout_s=3.0, max_output_bytes=1000) as pool:
        result = pool.run("print('a' * 5000)")
        assert result.limit_hit == "output" and result.stdout == "a" * 1000
        assert result.stdout_truncated and not result.stderr_truncated
        assert pool.run("print('b' * 999, end='')").ok  # at the cap is fine


@pytest.mark.slow
def test_cpu_limit_is_reported_as_cpu():
    with PythonSandbox(workers=1, timeout_s=20.0, cpu_s=1.0) as pool:
        result = pool.run("while True:\n    pass")
    assert result.limit_hit == "cpu", result
    assert result.exit_code in (-24, -9)  # SIGXCPU at the soft limit, SIGKILL at the hard one


def test_bad_constructor_arguments_raise_value_error_naming_them(tmp_path: Path):
    """Refused before any worker starts (a quick test: it may start no process)."""
    for kwargs, name in (({"workers": 0}, "workers"), ({"timeout_s": 0}, "timeout_s"),
                         ({"memory_mb": 16}, "memory_mb"), ({"cpu_s": -1}, "cpu_s"),
                         ({"isolation": "chroot"}, "isolation"), ({"preload": "numpy"}, "preload"),
                         ({"max_output_bytes": 0}, "max_output_bytes"),
                         ({"python_path": [str(tmp_path / "missing")]}, "python_path"),
                         ({"python_path": [str(REPO / "src")]}, "python_path"),  # the checkout
                         ({"hidden": ["relative/dir"]}, "hidden")):
        with pytest.raises(ValueError, match=name):
            PythonSandbox(**kwargs)


def test_bad_run_arguments_raise_value_error_naming_them(sandbox: PythonSandbox):
    with pytest.raises(ValueError, match="code"):
        sandbox.run(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox.run("print(1)", timeout_s=-1)
    with pytest.raises(ValueError, match=r"codes\[1\]"):
        sandbox.run_many(["print(1)", None])  # type: ignore[list-item]


def test_closed_sandbox_refuses_and_leaves_no_worker():
    pool = PythonSandbox(workers=2, timeout_s=2.0)
    pids = pool.worker_pids()
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.run("print(1)")
    time.sleep(0.1)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_worker_killed_mid_call_gives_a_defined_result_and_is_replaced():
    with PythonSandbox(workers=1, timeout_s=10.0) as pool:
        uids = set(pool.worker_uids())
        [pid] = pool.worker_pids()
        box: list[SandboxResult] = []
        thread = threading.Thread(target=lambda: box.append(pool.run(
            "import subprocess, time\nsubprocess.Popen(['sleep', '100'], start_new_session=True)"
            "\ntime.sleep(100)")))
        thread.start()
        time.sleep(0.5)
        os.kill(pid, 9)
        thread.join(timeout=30)
        [result] = box
        assert result.exit_code is None and result.limit_hit == "sandbox_error"
        assert pool.restarts == 1 and pool.worker_pids() != [pid]
        assert pool.run("print('alive')").stdout == "alive\n"
        if ROOT:  # the orphaned sleep of the dead worker's uid was killed from outside
            assert _processes_of(uids) == []


def test_parent_killed_mid_call_leaves_nothing_behind(tmp_path: Path):
    """SIGKILL the process that owns the pool while code (with an escaped grandchild) runs: the
    workers notice their parent is gone, kill what their code started, and exit."""
    script = tmp_path / "owner.py"
    script.write_text(
        "import json, sys, threading\n"
        "from gear_rl.agent.tools import PythonSandbox\n"
        "pool = PythonSandbox(workers=2, timeout_s=60.0)\n"
        "print(json.dumps({'pids': pool.worker_pids(), 'uids': pool.worker_uids()}), flush=True)\n"
        "code = ('import subprocess, time\\n'\n"
        "        \"subprocess.Popen(['sleep', '300'], start_new_session=True)\\n\"\n"
        "        'print(1, flush=True)\\ntime.sleep(300)')\n"
        "threading.Thread(target=pool.run_many, args=([code, code],), daemon=True).start()\n"
        "threading.Event().wait()\n"
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        info = json.loads(owner.stdout.readline())
        time.sleep(1.5)  # both calls are running
        if ROOT:
            assert _processes_of(set(info["uids"])), "the calls did not start"
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = [p for p in info["pids"] if Path(f"/proc/{p}").exists()
                 and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]]
        leftovers = _processes_of(set(info["uids"])) if ROOT else []
        if not alive and not leftovers:
            break
        time.sleep(0.1)
    assert not alive, f"workers outlived their parent: {alive}"
    assert not leftovers, f"sandboxed processes outlived the pool: {leftovers}"


@pytest.mark.skipif(not ROOT, reason="root mode needs root")
def test_root_mode_reports_full_isolation_and_leaves_host_mounts_alone(sandbox: PythonSandbox):
    before = _mountinfo()
    with PythonSandbox(workers=1, timeout_s=2.0) as pool:
        iso = pool.isolation
        assert _mountinfo() == before  # the worker's mounts stay in its own namespace
        assert pool.run("print(1)").ok
        assert pool.not_enforced == [] and pool.isolation_warning is None
    assert iso["mode"] == "root"
    for key in GUARANTEES:
        assert iso[key] is True, (key, iso)
    assert iso["notes"] == []
    assert iso["kill_all"] == "pid_namespace" and 200_000 <= iso["uid"] <= 299_999
    assert sandbox.isolation["uid"] != iso["uid"]


@pytest.mark.skipif(not ROOT, reason="compares against root mode")
def test_workers_get_distinct_uids(sandbox: PythonSandbox):
    uids = sandbox.worker_uids()
    assert len(set(uids)) == len(uids) == 2
    seen = {int(r.stdout) for r in sandbox.run_many(["import os\nprint(os.getuid())"] * 6)}
    assert seen <= set(uids)


def test_preload_modules_are_shared_with_executions():
    with PythonSandbox(workers=1, timeout_s=5.0, preload=("fractions",)) as pool:
        result = pool.run("import sys\nprint('fractions' in sys.modules)")
    assert result.stdout == "True\n"


def test_python_path_is_importable_and_read_only(tmp_path: Path):
    library = tmp_path / "toollib"
    library.mkdir()
    (library / "mytool.py").write_text("def answer():\n    return 42\n")
    with PythonSandbox(workers=1, timeout_s=5.0, python_path=[str(library)]) as pool:
        result = pool.run("import mytool\nprint(mytool.answer())")
        assert result.stdout == "42\n", result
        result = pool.run(f"open('{library}/mytool.py', 'a').write('x = 1')")
        assert "Read-only file system" in result.stderr or "Permission" in result.stderr


def test_packages_are_an_allowlist():
    """Only the declared packages (and what they require) import; others are not there."""
    with pytest.raises(ValueError, match="packages: package 'no_such_package_xyz'"):
        PythonSandbox(packages=["no_such_package_xyz"])  # found out by a planning process
    with PythonSandbox(workers=1, timeout_s=10.0, packages=("sympy",)) as pool:
        assert any(p.startswith("mpmath==") for p in pool.root_plan["packages"])
        result = pool.run("import sympy, mpmath\nprint(sympy.sqrt(8))")
        assert result.stdout == "2*sqrt(2)\n", result
        for module in ("numpy", "torch", "gear_rl", "transformers"):
            result = pool.run(f"import {module}")
            assert "ModuleNotFoundError" in result.stderr, (module, result)
    with PythonSandbox(workers=1, timeout_s=5.0, packages=()) as pool:
        assert "ModuleNotFoundError" in pool.run("import sympy").stderr
        assert pool.run("import json, decimal, sqlite3, ctypes\nprint(1)").stdout == "1\n"


def test_limit_names_are_documented():
    assert set(LIMIT_NAMES) >= {"timeout", "cpu", "memory", "output", "file_size", "processes"}


# --- reduced isolation ----------------------------------------------------------------------
def _contained_escape_checks(pool: PythonSandbox) -> None:
    """What every mode must still do: limits, time-outs, and kill escaped grandchildren."""
    assert pool.run("print(2 + 2)").stdout == "4\n"
    assert pool.run("x = bytearray(1 << 34)").limit_hit == "memory"
    assert pool.run("while True: pass", timeout_s=0.5).limit_hit in ("timeout", "cpu")
    marker = f"gear-sandbox-escape-{os.getpid()}-{time.monotonic_ns()}"
    result = pool.run(
        "import subprocess\n"
        f"subprocess.Popen(['sh', '-c', 'exec -a {marker} sleep 100'], start_new_session=True)\n"
        "print('ok')")
    assert result.stdout == "ok\n"
    time.sleep(0.2)
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert survivors == "", f"escaped process survived: {survivors}"


@pytest.mark.skipif(not ROOT, reason="as root, 'userns' mode is chosen explicitly")
def test_user_namespace_mode_as_root(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING), PythonSandbox(workers=1, timeout_s=2.0,
                                                         isolation="userns") as pool:
        iso = pool.isolation
        assert iso["mode"] == "userns"
        assert pool.not_enforced == ["uid_drop"], iso
        assert iso["kill_all"] == "pid_namespace"
        assert "isolation is reduced" in caplog.text and "uid_drop" in caplog.text
        assert "uid_drop" in (pool.isolation_warning or "")
        _contained_escape_checks(pool)
        result = pool.run(f"open('{REPO}/pwned', 'w')")
        assert not (REPO / "pwned").exists(), result
        assert any(e in result.stderr for e in REPO_WRITE_ERRORS), result
        # the code runs as the worker's uid: the worker's /proc entries are still out of reach
        result = pool.run(
            "import os\nnames = ['/proc/1/root/', '/proc/1/cwd/', '/proc/1/environ', '/proc/1/mem']"
            "\nnames += [f'/proc/1/fd/{fd}' for fd in os.listdir('/proc/1/fd')]"
            "\nfor name in names:\n    try:\n"
            "        print(name, os.listdir(name) if name.endswith('/') else"
            " open(name, 'rb').read(100))\n"
            "    except OSError as e:\n        print(type(e).__name__)")
        lines = result.stdout.splitlines()
        assert len(lines) > 4 and set(lines) == {"PermissionError"}, result
        result = pool.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                          "print(libc.umount2(b'/tmp', 2), ctypes.get_errno())")
        assert result.stdout == "-1 1\n", result  # capabilities dropped: the mounts stay
        fork_bomb = pool.run("import os\nwhile True:\n    os.fork()", timeout_s=2.0)
        assert fork_bomb.limit_hit in ("processes", "timeout"), fork_bomb


def test_no_isolation_mode_warns_and_still_limits(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING), PythonSandbox(workers=1, timeout_s=2.0,
                                                         isolation="none") as pool:
        assert pool.isolation["mode"] == "none" and not pool.isolation["network"]
        assert "isolation is reduced" in caplog.text
        assert set(pool.not_enforced) - {"seccomp"} == set(GUARANTEES) - {"seccomp"}, pool.isolation
        _contained_escape_checks(pool)
    with pytest.raises(RuntimeError, match="isolation is reduced"):
        PythonSandbox(workers=1, isolation="none", require_isolation=True)


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.slow
@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None
                    or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root, setpriv and a system python3")
def test_unprivileged_user_gets_user_namespace_mode():
    """A real non-root caller (uid 65534): the pool degrades to user-namespace mode and says so."""
    with tempfile.TemporaryDirectory(prefix="gear-sandbox-nobody-") as directory:
        _run_as_nobody(Path(directory))


def _run_as_nobody(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from gear_rl.agent.tools import PythonSandbox\n"
        "with PythonSandbox(workers=1, timeout_s=2.0, packages=()) as pool:\n"
        "    a = pool.run('import socket\\ntry:\\n    socket.create_connection((\"127.0.0.1\", 1),"
        " timeout=1)\\nexcept OSError as e:\\n    print(e.errno)')\n"
        "    b = pool.run('import os\\nwhile True:\\n    os.fork()')\n"
        f"    c = pool.run(\"open('{REPO}/pwned', 'w')\")\n"
        "    print(json.dumps({'mode': pool.isolation['mode'], 'net': a.stdout,"
        " 'bomb': b.limit_hit, 'write': c.stderr.splitlines()[-1]}))\n"
    )
    tmp_path.chmod(0o755)
    script.chmod(0o644)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    # The sandbox module needs the standard library only; the system interpreter is one an
    # unprivileged user can run (this project's venv interpreter may live under /root).
    completed = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON,
         str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    import json

    report = json.loads(completed.stdout.splitlines()[-1])
    assert report["mode"] == "userns", (report, completed.stderr)
    assert report["net"] in ("1\n", "101\n")  # EPERM (seccomp) or ENETUNREACH
    assert report["bomb"] in ("processes", "timeout")
    assert not (REPO / "pwned").exists(), report
    assert any(e in report["write"] for e in REPO_WRITE_ERRORS), report
    assert "isolation is reduced" in completed.stderr
