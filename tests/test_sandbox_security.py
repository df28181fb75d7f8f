"""Hostile-program corpus for ``PythonSandbox``: every program must be contained, the host and
the pool must be healthy afterwards, and the next execution must be correct.

Runs against the real sandbox (root mode where the tests run as root, which is how this project
runs them locally and in CI). After every program an autouse fixture checks: no process of a
sandbox uid is left, the worker processes are the same (unless the program was meant to break
one), the sentinel files outside the sandbox are intact, the TCP/Unix servers saw no connection,
and ``print(6 * 7)`` gives ``42``.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gear_rl.agent.tools import PythonSandbox, SandboxResult

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the corpus asserts root-mode isolation")

REPO = Path(__file__).resolve().parents[1]
SECRET_NAME = "GEAR_RL_SANDBOX_TEST_SECRET"


class _Server:
    """A TCP server on 127.0.0.1 or a world-writable Unix socket; counts connections."""

    def __init__(self, family: int, address: object) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        if family == socket.AF_UNIX:
            os.chmod(str(address), 0o777)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.address = self.sock.getsockname()
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@dataclass
class Host:
    sandbox: PythonSandbox
    sandbox_noseccomp: PythonSandbox
    secret: str
    tmp_sentinel: Path
    repo_sentinel: Path
    tcp: _Server
    unix: _Server
    unix_path: Path
    home_token: Path

    def fmt(self, code: str) -> str:
        return code.format(
            tmp_sentinel=self.tmp_sentinel, repo_sentinel=self.repo_sentinel, repo=REPO,
            port=self.tcp.address[1], unix_path=self.unix_path, test_pid=os.getpid(),
            secret_name=SECRET_NAME, worker_pid=self.sandbox.worker_pids()[0],
            home_token=self.home_token,
        )


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory):
    secret = "s3cr3t-" + secrets.token_hex(16)
    os.environ[SECRET_NAME] = secret  # set before the workers start: they must not inherit it
    tmp_dir = tmp_path_factory.mktemp("sandbox-host")
    tmp_sentinel = tmp_dir / "sentinel.txt"
    tmp_sentinel.write_text("keep me")
    tmp_sentinel.chmod(0o666)
    tmp_dir.chmod(0o777)  # even world-writable host paths must be out of reach
    tag = secrets.token_hex(4)
    repo_sentinel = REPO / f".sandbox-sentinel-{tag}"
    repo_sentinel.write_text("keep me too")
    repo_sentinel.chmod(0o666)
    unix_path = REPO / f".sandbox-test-{tag}.sock"
    # a world-readable token in a home directory, as tool caches leave them
    home_dir = Path("/home") / f".gear-sandbox-test-{tag}"
    home_dir.mkdir(mode=0o755, parents=True)
    home_token = home_dir / "token"
    home_token.write_text(secret)
    home_token.chmod(0o644)
    tcp = _Server(socket.AF_INET, ("127.0.0.1", 0))
    unix = _Server(socket.AF_UNIX, str(unix_path))
    sandbox = PythonSandbox(workers=2, timeout_s=1.0, memory_mb=256, max_processes=16,
                            max_output_bytes=4096, max_file_mb=1, scratch_mb=8)
    plain = PythonSandbox(workers=1, timeout_s=1.0, memory_mb=256, max_processes=16,
                          max_output_bytes=4096, max_file_mb=1, scratch_mb=8, seccomp=False)
    try:
        yield Host(sandbox, plain, secret, tmp_sentinel, repo_sentinel, tcp, unix, unix_path,
                   home_token)
    finally:
        sandbox.close()
        plain.close()
        tcp.close()
        unix.close()
        for path in (repo_sentinel, unix_path, home_token):
            path.unlink(missing_ok=True)
        home_dir.rmdir()
        del os.environ[SECRET_NAME]


def _processes_of(uids: set[int]) -> list[tuple[int, int]]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uid = os.stat(f"/proc/{name}").st_uid
            except OSError:
                continue
            if uid in uids:
                found.append((int(name), uid))
    return found


@pytest.fixture(autouse=True)
def healthy_afterwards(host: Host):
    uids = set(host.sandbox.worker_uids()) | set(host.sandbox_noseccomp.worker_uids())
    pids = host.sandbox.worker_pids()
    yield
    assert _processes_of(uids) == [], "a sandboxed process outlived its call"
    assert host.tmp_sentinel.read_text() == "keep me"
    assert host.repo_sentinel.read_text() == "keep me too"
    assert host.tcp.connections == 0 and host.unix.connections == 0
    for sandbox in (host.sandbox, host.sandbox_noseccomp):
        results = sandbox.run_many(["print(6 * 7)"] * sandbox.workers)
        assert [r.stdout for r in results] == ["42\n"] * sandbox.workers, results
    assert host.sandbox.worker_pids() == pids, "a worker had to be replaced"
    assert not (REPO / "pwned").exists()


Check = Callable[[SandboxResult, Host], None]


def limit(*names: str | None) -> Check:
    def check(result: SandboxResult, host: Host) -> None:
        assert result.limit_hit in names, result

    return check


def failed_with(*fragments: str) -> Check:
    """The program ran and ended with an error mentioning one of ``fragments``."""

    def check(result: SandboxResult, host: Host) -> None:
        assert result.exit_code != 0 or "DENIED" in result.stdout, result
        text = result.stdout + result.stderr
        assert any(f in text for f in fragments), result

    return check


def printed(expected: str) -> Check:
    def check(result: SandboxResult, host: Host) -> None:
        assert result.stdout == expected, result

    return check


def no_secret(result: SandboxResult, host: Host) -> None:
    assert host.secret not in result.stdout + result.stderr, result
    assert result.exit_code == 0, result


def _forged_status(payload: dict) -> str:
    """A program that lists its open descriptors, then writes a status report the worker would
    once have believed (``payload``) to every descriptor above stderr, and exits at once."""
    data = json.dumps(payload).encode()
    program = ("import os\nfds = []\nfor fd in range(1024):\n    try:\n        os.fstat(fd)\n"
               "        fds.append(fd)\n    except OSError:\n        pass\nprint(fds, flush=True)\n"
               "for fd in range(3, 1024):\n    try:\n"
               f"        os.write(fd, {data!r})\n        print('wrote', fd, flush=True)\n"
               "    except OSError:\n        pass\nos._exit(0)\n")
    return program.replace("{", "{{").replace("}", "}}")  # Host.fmt


def _nothing_forged(result: SandboxResult, host: Host) -> None:
    """Only stdin, stdout and stderr are open, nothing took the report, and the result says
    what happened: a clean exit, no limit (the autouse fixture checks no worker was replaced)."""
    assert (result.stdout, result.exit_code, result.limit_hit) == ("[0, 1, 2]\n", 0, None), result


# (name, program, check). Programs are str.format'ed by Host.fmt (double the braces).
CORPUS: list[tuple[str, str, Check]] = [
    # --- processes ---
    ("fork_bomb", "import os\nwhile True:\n    os.fork()\n", limit("processes", "timeout")),
    ("fork_bomb_ignoring_errors",
     "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
     limit("timeout", "processes", "cpu")),
    ("thread_bomb",
     "import threading, time\nwhile True:\n"
     "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
     limit("processes", "memory")),
    ("shell_outlives_call",
     "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 100'], start_new_session=True)\n"
     "subprocess.Popen(['nohup', 'sleep', '100'], stdout=subprocess.DEVNULL,"
     " stderr=subprocess.DEVNULL)\nprint('spawned')\n",
     printed("spawned\n")),
    ("double_fork_daemon",
     "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
     "        time.sleep(100)\n    os._exit(0)\nprint('parent done')\n",
     printed("parent done\n")),
    ("daemon_keeps_writing",
     "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n"
     "        print('tick', flush=True)\n        time.sleep(0.01)\nprint('bye')\n",
     lambda r, h: None),
    # --- cpu / memory / time ---
    ("infinite_loop", "while True:\n    pass\n", limit("timeout", "cpu")),
    ("busy_threads",
     "import threading\ndef spin():\n    while True:\n        pass\n"
     "for _ in range(8):\n    threading.Thread(target=spin).start()\n",
     limit("timeout", "cpu")),
    ("sleep_forever", "import time\ntime.sleep(1000)\n", limit("timeout")),
    ("memory_bomb_one_block", "x = bytearray(1 << 34)\n", limit("memory")),
    # (200 MB really written before the limit: on a very busy machine the time-out may win)
    ("memory_bomb_growing", "a = []\nwhile True:\n    a.append(' ' * 10**8)\n",
     limit("memory", "timeout")),
    ("deep_recursion_segfault",
     "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
     lambda r, h: None),
    ("stop_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n", limit("timeout")),
    # --- output ---
    ("huge_stdout", "print('x' * 10**7)\n", limit("output")),
    ("endless_stderr", "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)\n",
     limit("output")),
    ("invalid_utf8", "import sys\nsys.stdout.buffer.write(b'ok\\xff\\xfe\\n')\n",
     lambda r, h: r.stdout.startswith("ok") or pytest.fail(repr(r))),
    # --- files ---
    ("write_host_tmp_sentinel", "open('{tmp_sentinel}', 'w').write('pwned')\n",
     failed_with("FileNotFoundError", "PermissionError", "Read-only")),
    ("write_tmp", "open('/tmp/pwned', 'w').write('x')\n",
     failed_with("PermissionError", "Read-only")),
    ("write_repo", "open('{repo}/pwned', 'w').write('x')\n",
     failed_with("Read-only", "PermissionError", "FileNotFoundError")),
    ("write_etc", "open('/etc/pwned', 'w').write('x')\n", failed_with("Read-only", "Permission")),
    ("delete_sentinels",
     "import os\nfor p in ('{tmp_sentinel}', '{repo_sentinel}'):\n    try:\n"
     "        os.remove(p)\n    except OSError as e:\n        print('DENIED', type(e).__name__)\n",
     failed_with("DENIED")),
    ("rmtree_repo", "import shutil\nshutil.rmtree('{repo}/src')\n",
     failed_with("Read-only", "PermissionError", "FileNotFoundError")),
    ("chmod_repo", "import os\nos.chmod('{repo}', 0o777)\n",
     failed_with("PermissionError", "Read-only", "FileNotFoundError")),
    ("huge_file", "open('big', 'wb').write(b'0' * (8 << 20))\n", limit("file_size")),
    ("fill_scratch_disk",
     "for i in range(100):\n    open(f'f{{i}}', 'wb').write(b'0' * (900 << 10))\n",
     limit("disk", "file_size")),
    ("too_many_open_files", "fs = [open('/dev/null') for _ in range(10**5)]\n",
     limit("open_files")),
    ("symlink_to_shadow", "import os\nos.symlink('/etc/shadow', 'x')\nprint(open('x').read())\n",
     failed_with("PermissionError", "FileNotFoundError")),
    # --- secrets and the parent ---
    ("read_environment", "import os\nprint(dict(os.environ))\n", no_secret),
    ("read_parent_environ",
     "print(open('/proc/{test_pid}/environ', 'rb').read())\n",
     failed_with("FileNotFoundError", "PermissionError")),
    ("read_pid1_environ", "print(open('/proc/1/environ', 'rb').read())\n",
     failed_with("FileNotFoundError", "PermissionError")),
    ("scan_proc_for_secret",
     "import os\nfound = []\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
     "            found.append(open(f'/proc/{{p}}/environ', 'rb').read())\n"
     "        except OSError:\n            pass\n"
     "print(len(found), b'{secret_name}' in b''.join(found))\n",
     lambda r, h: ("True" not in r.stdout and h.secret not in r.stdout) or pytest.fail(repr(r))),
    ("read_root_home",
     "import os\nprint(os.listdir('/root'))\nprint(open('/root/.bashrc').read())\n",
     failed_with("FileNotFoundError", "PermissionError")),
    ("read_shadow", "print(open('/etc/shadow').read())\n",
     failed_with("PermissionError", "FileNotFoundError")),
    ("read_world_readable_home_token", "print(open('{home_token}').read())\n",
     failed_with("FileNotFoundError")),
    # --- network ---
    ("tcp_to_host_server",
     "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
     failed_with("PermissionError", "OSError", "Network is unreachable")),
    ("udp_to_host", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
     ".sendto(b'x', ('127.0.0.1', {port}))\n", failed_with("PermissionError", "unreachable")),
    ("unix_socket_to_host_server",
     "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{unix_path}')\n",
     failed_with("PermissionError", "FileNotFoundError")),
    # --- signals and the parent ---
    ("kill_parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
     failed_with("PermissionError")),
    ("kill_test_process", "import os, signal\nos.kill({test_pid}, signal.SIGKILL)\n",
     failed_with("ProcessLookupError", "PermissionError")),
    ("kill_worker_by_pid", "import os, signal\nos.kill({worker_pid}, signal.SIGKILL)\n",
     failed_with("ProcessLookupError", "PermissionError")),
    ("kill_everything_visible", "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
     limit(None)),
    ("segfault_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
     lambda r, h: r.exit_code == -11 or pytest.fail(repr(r))),
    # --- privilege: ctypes and setuid binaries ---
    ("ctypes_setuid_root",
     "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.setuid(0), libc.getuid())\n",
     lambda r, h: r.stdout.startswith("-1 ") or pytest.fail(repr(r))),
    ("ctypes_unshare_user_ns",
     "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "print(libc.unshare(0x10000000 | 0x40000000), ctypes.get_errno())\n",
     printed("-1 1\n")),
    ("ctypes_mount",
     "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n",
     printed("-1 1\n")),
    ("ctypes_kill_parent",
     "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "print(libc.kill(os.getppid(), 9), ctypes.get_errno())\n",
     printed("-1 1\n")),
    ("ctypes_ptrace_parent",
     "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "print(libc.ptrace(16, os.getppid(), None, None), ctypes.get_errno())\n",
     printed("-1 1\n")),
    ("setuid_binary_mount",
     "import subprocess\nr = subprocess.run(['mount', '-t', 'tmpfs', 'x', '/mnt'],"
     " capture_output=True)\nprint(r.returncode != 0)\n",
     printed("True\n")),
    ("raise_rlimits",
     "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6))\n",
     failed_with("ValueError", "PermissionError")),
    # --- persistence between executions (checked by the follow-up runs) ---
    ("poison_module_state", "import json\njson.dumps = None\nprint('poisoned')\n",
     printed("poisoned\n")),
    ("sysv_shared_memory",
     "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "print(libc.shmget(4242, 4096, 0o1666) >= 0)\n",
     printed("True\n")),
    # --- interpreter exits ---
    ("system_exit", "raise SystemExit(3)\n", lambda r, h: r.exit_code == 3 or pytest.fail(
        repr(r))),
    ("keyboard_interrupt", "raise KeyboardInterrupt\n",
     lambda r, h: (r.exit_code == 1 and "KeyboardInterrupt" in r.stderr) or pytest.fail(
         repr(r))),
    ("os_exit", "import os\nos._exit(7)\n", lambda r, h: r.exit_code == 7 or pytest.fail(
        repr(r))),
    ("close_stdio_fds", "import os\nos.closerange(0, 100)\n", limit(None)),
    # --- the worker's status channel: the code holds nothing but stdin, stdout and stderr ---
    *[(f"forge_status_{name}", _forged_status(payload), _nothing_forged)
      for name, payload in (
          ("setup_error", {"setup_error": "forged"}),
          ("memory", {"exc": "MemoryError", "errno": 12, "exit": 0}),
          ("processes", {"exc": "BlockingIOError", "errno": 11}),
          ("threads", {"exc": "RuntimeError", "message": "new thread", "tasks": 99}))],
    ("syntax_error", "def (:\n", failed_with("SyntaxError")),
]


# Programs that only end at the 1 s wall-time limit (twice: with and without seccomp).
SLOW = {"fork_bomb_ignoring_errors", "infinite_loop", "busy_threads", "sleep_forever",
        "stop_self", "deep_recursion_segfault"}


@pytest.mark.parametrize("name, program, check", [
    pytest.param(*entry, id=entry[0], marks=[pytest.mark.slow] if entry[0] in SLOW else [])
    for entry in CORPUS])
def test_hostile_program_is_contained(host: Host, name: str, program: str, check: Check):
    """The program, with every layer on, passes its check; with seccomp off it is still
    contained (the autouse fixture checks the host)."""
    code = host.fmt(program)
    result = host.sandbox.run(code)
    assert result.duration_s < 10, result
    check(result, host)
    result = host.sandbox_noseccomp.run(code)
    assert host.secret not in result.stdout + result.stderr


def test_corpus_size():
    assert len(CORPUS) >= 30


def test_state_does_not_leak_between_executions(host: Host):
    sandbox = host.sandbox_noseccomp  # one worker: the second run lands where the first did
    assert sandbox.run("import json\njson.leak = 1\nopen('/dev/shm/leak', 'w').write('x')\n"
                       "open('mine', 'w').write('x')\nprint('ok')").stdout == "ok\n"
    result = sandbox.run(
        "import json, os, ctypes\nprint(hasattr(json, 'leak'), os.path.exists('/dev/shm/leak'),"
        " os.listdir('.'), ctypes.CDLL(None).shmget(4242, 0, 0))"
    )
    assert result.stdout == "False False [] -1\n", result


def test_network_namespace_without_seccomp(host: Host):
    """With seccomp off, sockets can be made but lead nowhere: the namespace has no route, and
    the host's Unix sockets (one world-writable in the checkout here) are not in the root."""
    result = host.sandbox_noseccomp.run(host.fmt(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "except OSError as e:\n    print(e.errno)\n"
        "s = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('{unix_path}')\n"
        "except OSError as e:\n    print(e.errno)\nprint(socket.if_nameindex())\n"))
    lines = result.stdout.splitlines()
    assert lines[0] == "101", result  # ENETUNREACH: only a loopback, and it is down
    assert lines[1] == str(errno.ENOENT) and host.unix.connections == 0, result
    assert lines[-1] == "[(1, 'lo')]", result
