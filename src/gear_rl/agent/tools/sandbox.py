"""``PythonSandbox``: run model-written Python without letting it touch the host.

A pool of warm worker processes (``_sandbox_worker.py``, started as ``python -I`` with a scrubbed
environment in a new session). Each worker isolates itself once, then forks one short-lived child
per execution; see the worker's docstring for the mechanics. What the pool enforces depends on
what the OS allows, and it says so: ``sandbox.not_enforced`` names the guarantees (keys of
``GUARANTEES``) the pool could not give, ``sandbox.isolation`` is the worker's full report.

What the code sees (root and user-namespace modes): a root of its own, built from an allowlist
and entered with ``pivot_root`` (the host's file system is detached, not covered): system
software (``/usr/bin``, ``/usr/lib``, ``/usr/share``..., the merged-/usr links, the loader cache
and ``/etc/localtime``), the interpreter's binary and its prefix's ``lib`` directory, of a
virtual environment only ``pyvenv.cfg`` and the ``bin/python*`` links, the declared ``packages``
(and what they require) and every other package directory empty, the ``python_path`` and
``mounts`` paths, all read-only; a scratch tmpfs (its working directory is a fresh directory in
it), ``/dev`` with ``null``, ``zero``, ``full``, ``random``, ``urandom`` and a private
``/dev/shm``, and a ``/proc`` of its own pid namespace in which what describes the host (its
kernel command line and configuration, modules, hardware, disks, host-wide memory and lock
tables: the worker's ``PROC_MASKED_FILES`` and ``PROC_MASKED_DIRS``) shows empty and
``meminfo`` shows ``memory_mb``; a cgroup namespace (``/proc/self/cgroup`` shows ``/``) and the
host name ``sandbox``. Nothing else: no project checkout, run
directory, data file, model cache, home, ``/opt``, ``/srv``, ``/var``, ``/run`` or host ``/etc``.
``hidden`` paths (and the project checkout) are cut out even where they lie under an exposed
directory (its other entries are bound one by one, so the hidden name does not show), and a
mount that overlaps one is refused (``check_mounts``). ``sandbox.root_plan`` lists what is
exposed.

Modes (``sandbox.isolation["mode"]``):

- ``"root"`` (running as root, the tested configuration): every guarantee of ``GUARANTEES``.
  Pid, network, mount, IPC and UTS namespaces; the root above; a distinct unprivileged uid/gid
  per worker (so ``RLIMIT_NPROC`` is a real per-worker process cap, root-owned files are out of
  reach and nothing outside can be signalled or ptraced); ``/proc`` mounted ``hidepid=2``; a
  seccomp filter (x86_64) denying mount/namespace/ptrace/keyring/bpf/io_uring calls and new
  sockets. When a worker dies, the kernel kills its whole pid namespace, and a reaper with the
  worker's uid kills anything of that uid from outside.
- ``"userns"`` (not root, unprivileged user namespaces allowed; or ``isolation="userns"``): the
  same namespaces and root, built through a user namespace; all capabilities dropped before the
  code runs, and the worker made non-dumpable so the code cannot reach its ``/proc`` entries.
  Not enforced: ``uid_drop`` (the code runs as the calling user, mapped to uid 0 of its
  namespace without capabilities). Where the host's ``/proc`` is partly masked (some
  containers), the kernel refuses a fresh ``/proc`` and ``own_proc`` is reported missing.
- ``"none"`` (no namespaces at all): resource limits, a scratch directory, a scrubbed
  environment, seccomp and the process-tree kill only; none of the file-system, network,
  ``/proc``, IPC, uid, process-count or host-information guarantees. A warning is logged; pass
  ``require_isolation=True`` to refuse to start instead.

The code's process holds stdin, stdout and stderr only: the pipe on which the child's set-up
reports a failure is closed before the code runs. So the result is made of what the kernel
recorded (exit status, signal, CPU time) and what the code printed, and a limit that an
exception names (``memory``, ``processes``, ``open_files``, ``file_size``, ``disk``) is read from
the traceback at the end of ``stderr`` (see ``SandboxResult.limit_hit``): the label always agrees
with the output, and the code cannot claim ``sandbox_error``.

The code runs as the ``__main__`` module (``sys.modules["__main__"]``), as under ``python -c``:
``multiprocessing.Pool.map`` and ``ProcessPoolExecutor`` work on functions it defines (the
default ``fork`` start method; each worker process counts against ``max_processes``).

Not enforced anywhere: a limit on the sum of memory of all processes of one run (no cgroup is
created: ``memory_mb`` x ``max_processes`` bounds it), disk I/O and CPU share; the names of
exposed host paths (and the mount options, such as a ``devtmpfs`` size) show in
``/proc/self/mountinfo`` (their contents outside the allowlist do not); what the kernel tells
every process through calls that cannot be masked (``uname``: the kernel version; ``sysinfo``:
host memory, uptime and load; ``cpuid`` and ``sched_getaffinity``: the processor and the CPU
count), so ``/proc`` still shows ``version``, ``cpuinfo``, ``stat``, ``loadavg`` and ``uptime``;
a package directory shared by several distributions (a namespace package such as ``google``) is
exposed whole once one of them is declared.

Always enforced: wall-time limit (whole process tree killed), CPU time (``RLIMIT_CPU``), address
space per process (``RLIMIT_AS``: ``memory_mb`` bounds each process, not their sum), file size
(``RLIMIT_FSIZE``), open files, no core files, output caps, ``no_new_privs``, scrubbed
environment (only ``PATH``, ``LANG`` and sandbox-local ``HOME``/``TMPDIR`` reach the code).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gear_rl.dataclass_config import shown

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_PACKAGES", "GUARANTEES", "LIMIT_NAMES", "PythonSandbox", "SandboxResult",
           "check_mounts"]

LIMIT_NAMES = ("timeout", "cpu", "memory", "output", "file_size", "processes", "open_files",
               "disk", "sandbox_error")
"""Values ``SandboxResult.limit_hit`` can take (besides ``None``). ``sandbox_error``: the sandbox
itself failed (a worker died or hung); the pool replaces the worker."""

DEFAULT_PACKAGES = ("numpy", "sympy")
"""Packages the code can import unless a task declares others (what tool-math needs); their
requirements (sympy's mpmath) come with them."""

GUARANTEES = {
    "allowlist_fs": "a root of its own: only the interpreter, the declared packages and mounts, "
                    "a scratch directory, a minimal /dev and its own /proc (no checkout, runs, "
                    "data, model cache, home or host /etc)",
    "readonly_fs": "nothing but the scratch directory and /dev/shm is writable, and both are "
                   "wiped after every execution",
    "network": "no network: only a loopback interface, and it is down",
    "own_proc": "a pid namespace and /proc of its own: no other process is visible or can be "
                "signalled",
    "ipc_namespace": "SysV IPC objects are private to the worker and wiped after every execution",
    "uid_drop": "a distinct unprivileged uid per worker: no capabilities, nothing root-owned "
                "writable, no process of another uid reachable",
    "process_limit": "RLIMIT_NPROC caps the processes and threads of one execution",
    "seccomp": "mount, namespace, ptrace, keyring, bpf and io_uring calls and new sockets are "
               "denied (x86_64)",
    "host_info": "/proc hides the host's kernel command line, configuration, modules, hardware, "
                 "disks and memory (meminfo shows the sandbox's limit); own cgroup namespace "
                 "and host name",
}
"""What the sandbox guarantees in root mode, name -> meaning. ``PythonSandbox.not_enforced``
lists the names a pool could not enforce."""

_WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
_UID_RANGE = (200_000, 299_999)
_SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_START_TIMEOUT_S = 30.0
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one execution.

    Attributes:
        stdout, stderr: what the code printed (UTF-8, undecodable bytes replaced), each cut at the
            pool's ``max_output_bytes``.
        exit_code: the process exit status (0 ok, ``sys.exit(n)`` gives ``n``, an uncaught
            exception gives 1), ``-N`` when killed by signal ``N`` (a timeout or an output
            overflow reports ``-9``), ``None`` when the sandbox itself failed.
        limit_hit: ``None`` or the name of the limit that ended or broke the run (see
            ``LIMIT_NAMES``): ``timeout`` (wall time), ``cpu`` (CPU seconds), ``output``,
            ``file_size`` (also ``SIGXFSZ``) and ``sandbox_error`` from what the worker saw;
            ``memory`` (a ``MemoryError`` or ``[Errno 12]``), ``processes`` (``fork`` refused
            with ``[Errno 11]``, or a thread refused near the process cap), ``open_files``
            (``[Errno 24]``), ``file_size`` (``[Errno 27]``) and ``disk`` (``[Errno 28]``,
            scratch full) when the run exited with status 1 and the last exception line in
            ``stderr`` names that error (a refused thread is followed by a ``[sandbox] N
            processes and threads were running`` line, which decides between ``processes``
            and ``memory``). Code that prints such a traceback itself and exits with 1 gets
            the label its output shows.
        duration_s: wall time of the execution as measured by the worker.
        cpu_s: CPU seconds used by the main process.
        stdout_truncated, stderr_truncated: whether that stream was cut.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    limit_hit: str | None
    duration_s: float
    cpu_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the code ran to completion with exit status 0 and no limit was hit."""
        return self.exit_code == 0 and self.limit_hit is None


@dataclass
class _Limits:
    timeout_s: float
    cpu_s: float
    memory_mb: int
    max_processes: int
    max_output_bytes: int
    max_file_mb: int
    max_open_files: int

    def as_dict(self, timeout_s: float | None = None) -> dict[str, Any]:
        values = dict(self.__dict__)
        if timeout_s is not None:
            values["timeout_s"] = timeout_s
            values["cpu_s"] = min(self.cpu_s, timeout_s) if self.cpu_s else timeout_s
        return values


def _scrubbed_env() -> dict[str, str]:
    """The only environment a worker starts with (nothing of the parent's but ``LANG``).
    ``MALLOC_ARENA_MAX`` keeps glibc from reserving 64 MiB of address space per thread, which
    would exhaust ``RLIMIT_AS`` in multi-threaded code without using memory."""
    return {"PATH": _SAFE_PATH, "LANG": os.environ.get("LANG", "C.UTF-8") or "C.UTF-8",
            "MALLOC_ARENA_MAX": "2"}


def _overlaps(path: str, other: str) -> bool:
    """True when one of the two real paths is the other or lies inside it."""
    return (path == other or path.startswith(other.rstrip("/") + "/")
            or other.startswith(path.rstrip("/") + "/"))


def check_mounts(mounts: Sequence[str], forbidden: Sequence[str | os.PathLike[str]] = (), *,
                 name: str = "mounts") -> list[str]:
    """Check paths to mount read-only into the sandbox; return their real paths, in order.

    Args:
        mounts: absolute paths (files or directories) the code may read, at the same path.
        forbidden: paths the code must never read (the run directory, which logs every reference
            answer; the task's data files); need not exist yet.
        name: what the error messages call ``mounts`` (e.g. ``"agent.sandbox_mounts"``).

    Raises:
        ValueError: naming ``name``, for a path that is not absolute or does not exist, and for
            one that is a forbidden path, contains one or lies inside one (symlinks resolved).
    """
    if isinstance(mounts, str) or not all(isinstance(m, str) for m in mounts):
        raise ValueError(f"{name} must be a list of absolute paths, got {shown(mounts)}")
    blocked = [(str(path), os.path.realpath(path)) for path in forbidden]
    resolved = []
    for mount in mounts:
        if not os.path.isabs(mount):
            raise ValueError(f"{name}: {shown(mount)} is not an absolute path")
        if not os.path.exists(mount):
            raise ValueError(f"{name}: {shown(mount)} does not exist")
        real = os.path.realpath(mount)
        for original, path in blocked:
            if _overlaps(real, path):
                raise ValueError(f"{name}: {shown(mount)} overlaps {original!r}, which sandboxed "
                                 "code must not read (it contains it, is it, or lies inside it)")
        resolved.append(real)
    return resolved


def project_checkout() -> str | None:
    """The source checkout this package runs from (an editable install: ``<root>/src/gear_rl``
    beside ``<root>/pyproject.toml``), or None. Always hidden from sandboxed code."""
    source = Path(__file__).resolve().parents[3]
    if source.name == "src" and (source.parent / "pyproject.toml").is_file():
        return str(source.parent)
    return None


def _plan_root(python: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The worker script's ``--plan``, run by the workers' interpreter (whose packages count)."""
    try:
        completed = subprocess.run(
            [python, "-I", str(_WORKER_SCRIPT), "--plan"], input=json.dumps(spec).encode(),
            capture_output=True, env=_scrubbed_env(), cwd="/", timeout=_START_TIMEOUT_S,
            check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"sandbox: could not plan the sandbox's root with {python}: {exc}"
                           ) from exc
    if completed.returncode != 0:
        raise RuntimeError("sandbox: planning the sandbox's root failed: "
                           + completed.stderr.decode(errors="replace")[-2000:])
    plan: dict[str, Any] = json.loads(completed.stdout)
    if "error" in plan:
        raise ValueError(f"packages: {plan['error']}")
    return plan


def _uids_of_running_processes() -> set[int]:
    uids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uids.add(os.stat(f"/proc/{name}").st_uid)
            except OSError:
                continue
    return uids


def _allocate_uid() -> int:
    """A random uid in 200000-299999 that no process and no other worker of ours uses."""
    busy = _uids_of_running_processes()
    with _uid_lock:
        for _ in range(1000):
            uid = random.randint(*_UID_RANGE)
            if uid not in busy and uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid
    raise RuntimeError("could not find a free sandbox uid in 200000-299999")


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def _kill_uid_from_parent(python: str, uid: int) -> None:
    """Kill every process of a sandbox uid from outside (used when a worker died)."""
    script = ("import os,signal,sys;u=int(sys.argv[1]);os.setgroups([]);os.setresgid(u,u,u);"
              "os.setresuid(u,u,u)\nfor _ in range(3):\n try: os.kill(-1,signal.SIGKILL)\n"
              " except ProcessLookupError: break")
    try:
        subprocess.run([python, "-I", "-c", script, str(uid)], env=_scrubbed_env(), timeout=10,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("sandbox: could not run the reaper for uid %d: %s", uid, exc)


class _Worker:
    """One worker process and its protocol pipes (used by one thread at a time)."""

    def __init__(self, python: str, config: dict[str, Any]) -> None:
        self.python = python
        self.uid = config["uid"]
        self.finished = False
        self.process = subprocess.Popen(
            [python, "-I", str(_WORKER_SCRIPT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=_scrubbed_env(), cwd="/", start_new_session=True, close_fds=True,
        )
        self._buffer = b""
        self._stderr_tail: list[str] = []
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True,
                                               name=f"sandbox-worker-{self.process.pid}-stderr")
        self._stderr_thread.start()
        self.send(config)
        hello = self.recv(_START_TIMEOUT_S)
        if hello is None or not hello.get("ready"):
            detail = (hello or {}).get("traceback") or (hello or {}).get("error") or "".join(
                self._stderr_tail[-20:])
            self.kill()
            raise RuntimeError(f"sandbox worker failed to start: {detail}")
        self.isolation: dict[str, Any] = hello["isolation"]
        # the process that forks the executions: in the namespace modes a child of the one
        # started here, pid 1 of its own pid namespace
        self.pid: int = hello["pid"]

    def _drain_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            self._stderr_tail = [*self._stderr_tail[-50:], line]
            logger.debug("sandbox worker %d: %s", self.process.pid, line)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def recv(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message, or None if the worker died or said nothing within ``timeout_s``."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, *, reap_uid: bool = True) -> None:
        """Kill the worker's whole session and (root mode, ``reap_uid``) every process of its
        uid; reap it. Idempotent; the uid is released afterwards, so it never runs twice."""
        if self.finished:
            return
        self.finished = True
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.warning("sandbox worker %d did not die", self.process.pid)
        if reap_uid and self.isolation_mode() == "root":
            _kill_uid_from_parent(self.python, self.uid)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        _release_uid(self.uid)

    def isolation_mode(self) -> str | None:
        return getattr(self, "isolation", {}).get("mode")

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit (it has no children between calls); kill it if it does not."""
        if self.finished:
            return
        clean = False
        try:
            self.send({"op": "exit"})
            clean = self.process.wait(timeout=timeout_s) == 0
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill(reap_uid=not clean)


def _shutdown_workers(workers: list[_Worker]) -> None:
    for worker in list(workers):
        with contextlib.suppress(Exception):  # a finaliser must never raise
            worker.close(timeout_s=1.0)


@dataclass
class _PoolState:
    workers: list[_Worker] = field(default_factory=list)
    idle: queue.Queue = field(default_factory=queue.Queue)


class PythonSandbox:
    """A pool of warm, isolated Python workers.

    Example::

        with PythonSandbox(workers=2, timeout_s=5.0, memory_mb=512) as sandbox:
            result = sandbox.run("print(2 + 2)")
            result.stdout, result.exit_code, result.limit_hit, result.duration_s

    Args:
        workers: number of worker processes (executions that can run at once).
        timeout_s: wall-time limit per execution, seconds.
        memory_mb: address-space limit (``RLIMIT_AS``) of each process the code runs, MiB. It
            includes the interpreter itself (about 30 MiB, more with ``preload``).
        cpu_s: CPU-time limit per process (``RLIMIT_CPU``, rounded up to whole seconds); default
            ``timeout_s``.
        max_processes: processes and threads the code may have at once (``RLIMIT_NPROC`` of the
            sandbox user; includes the main process).
        max_output_bytes: cap on each of stdout and stderr; beyond it the run is killed and
            ``limit_hit == "output"``.
        max_file_mb: largest file the code may write (``RLIMIT_FSIZE``).
        max_open_files: ``RLIMIT_NOFILE``.
        scratch_mb: size of each private tmpfs (the scratch directory lives in one).
        preload: modules each worker imports once at start (e.g. ``("math", "sympy")``), so
            executions that import them start faster; they are shared with every execution.
            Imported inside the sandbox's root: a package must be among ``packages``.
        packages: distributions (or import names) the code may import, with what they
            require (extras left out); every other installed package is invisible. The standard
            library is always there. A name that is not installed raises ``ValueError``.
        mounts: absolute paths (files or directories) the code may read, at the same path,
            read-only (e.g. a task's tool assets). Refused (``ValueError``) when one overlaps
            ``hidden`` or the project checkout: see ``check_mounts``.
        hidden: paths that must never show to the code, even where they lie under an exposed
            directory: the run directory, the task's data files. The project checkout is always
            among them.
        python_path: extra directories on the code's ``sys.path`` (mounted read-only, checked
            like ``mounts``).
        isolation: ``"auto"`` (the strongest the OS allows), ``"userns"`` (do not use root
            privileges even when available) or ``"none"`` (limits only; for debugging).
        require_isolation: raise ``RuntimeError`` instead of warning when the full ``"root"``
            isolation is not available.
        seccomp: install the seccomp filter where supported (x86_64).
        python: interpreter for the workers (default: this one).

    Thread-safe: ``run`` may be called from many threads; at most ``workers`` executions run at
    once. A worker that dies or hangs is replaced and its call returns a result with
    ``limit_hit="sandbox_error"``.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        *,
        cpu_s: float | None = None,
        max_processes: int = 32,
        max_output_bytes: int = 64 * 1024,
        max_file_mb: int = 16,
        max_open_files: int = 256,
        scratch_mb: int = 64,
        preload: Sequence[str] = (),
        packages: Sequence[str] = DEFAULT_PACKAGES,
        mounts: Sequence[str] = (),
        hidden: Sequence[str | os.PathLike[str]] = (),
        python_path: Sequence[str] = (),
        isolation: Literal["auto", "userns", "none"] = "auto",
        require_isolation: bool = False,
        seccomp: bool = True,
        python: str | None = None,
    ) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        for name, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb),
                            ("max_processes", max_processes),
                            ("max_output_bytes", max_output_bytes),
                            ("max_file_mb", max_file_mb), ("max_open_files", max_open_files),
                            ("scratch_mb", scratch_mb)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if cpu_s is not None and (not isinstance(cpu_s, (int, float)) or cpu_s <= 0):
            raise ValueError(f"cpu_s must be a positive number or None, got {cpu_s!r}")
        if memory_mb < 64:
            raise ValueError(
                f"memory_mb must be >= 64 (the interpreter needs ~30), got {memory_mb}")
        if max_open_files < 16:
            raise ValueError(f"max_open_files must be >= 16, got {max_open_files}")
        if isolation not in ("auto", "userns", "none"):
            raise ValueError(f"isolation must be 'auto', 'userns' or 'none', got {isolation!r}")
        for name, names in (("preload", preload), ("packages", packages)):
            if isinstance(names, str) or not all(isinstance(m, str) for m in names):
                raise ValueError(f"{name} must be a sequence of module names, got {names!r}")
        if isinstance(hidden, str) or not all(
                isinstance(p, (str, os.PathLike)) and os.path.isabs(p) for p in hidden):
            raise ValueError(f"hidden must be a sequence of absolute paths, got {hidden!r}")
        checkout = project_checkout()
        forbidden = [*hidden, *([checkout] if checkout else [])]
        python_path = check_mounts(python_path, forbidden, name="python_path")
        missing = [p for p in python_path if not os.path.isdir(p)]
        if missing:
            raise ValueError(f"python_path entries must be directories, missing: {missing}")
        mounts = check_mounts(mounts, forbidden, name="mounts")
        if sys.platform != "linux":
            raise RuntimeError("PythonSandbox needs Linux (namespaces, rlimits, /proc)")
        self.limits = _Limits(
            timeout_s=float(timeout_s), cpu_s=float(cpu_s if cpu_s is not None else timeout_s),
            memory_mb=int(memory_mb), max_processes=int(max_processes),
            max_output_bytes=int(max_output_bytes), max_file_mb=int(max_file_mb),
            max_open_files=int(max_open_files),
        )
        self._num_workers = workers
        self._python = python or sys.executable
        self.root_plan: dict[str, Any] = _plan_root(self._python, {
            "packages": list(packages), "mounts": mounts, "python_path": python_path,
            "hidden": [os.path.realpath(p) for p in forbidden]})
        """What the sandbox's root holds (the worker's ``plan_root``): ``binds`` (host paths
        exposed read-only), ``covers`` (package directories shown empty but for ``packages``),
        ``links`` (recreated symlinks), ``packages`` (``name==version``)."""
        self._base_config = {
            "isolation": isolation, "tmpfs_mb": int(scratch_mb), "tmpfs_inodes": 16384,
            "preload": list(preload), "seccomp": bool(seccomp), "python_path": python_path,
            "root": self.root_plan, "path_env": f"{os.path.dirname(self._python)}:{_SAFE_PATH}",
            "lang": _scrubbed_env()["LANG"], "memory_mb": self.limits.memory_mb,
        }
        self._require = require_isolation
        self._state = _PoolState()
        self._lock = threading.Lock()
        self._closed = False
        self.isolation: dict[str, Any] = {}
        self.restarts = 0
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                started = list(pool.map(lambda _: self._spawn(), range(workers)))
        except BaseException:
            _shutdown_workers(self._state.workers)
            raise
        for worker in started:
            self._state.idle.put(worker)
        self.isolation = dict(started[0].isolation)
        self._finalizer = weakref.finalize(self, _shutdown_workers, self._state.workers)
        self._check_isolation()

    # --- pool management -------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        uid = _allocate_uid()
        config = dict(self._base_config, uid=uid, gid=uid)
        try:
            worker = _Worker(self._python, config)
        except BaseException:
            _release_uid(uid)
            raise
        with self._lock:
            self._state.workers.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._state.workers:
                self._state.workers.remove(worker)

    def _check_isolation(self) -> None:
        message = self.isolation_warning
        if message is None:
            logger.info("sandbox: full isolation (root mode, uid %s)", self.isolation.get("uid"))
            return
        if self._require:
            self.close()
            raise RuntimeError(message)
        logger.warning(message)

    @property
    def not_enforced(self) -> list[str]:
        """Names of the ``GUARANTEES`` this pool does not enforce (empty in full root mode)."""
        return [name for name in GUARANTEES if not self.isolation.get(name)]

    @property
    def isolation_warning(self) -> str | None:
        """One line naming the mode and each guarantee it lacks with its meaning; None when the
        isolation is complete. The trainer logs it once per run."""
        missing = self.not_enforced
        if self.isolation.get("mode") == "root" and not missing:
            return None
        details = "; ".join(f"{name} ({GUARANTEES[name]})" for name in missing) or "nothing"
        return (f"sandbox isolation is reduced (mode {self.isolation.get('mode')!r}); not "
                f"enforced: {details}; notes: {self.isolation.get('notes')}")

    @property
    def workers(self) -> int:
        """Number of worker processes."""
        return self._num_workers

    # --- running code ----------------------------------------------------------------------------
    def run(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        """Run ``code`` (Python source) in a fresh sandboxed process; block until it finishes.

        Args:
            code: Python source, executed as ``__main__`` in a fresh globals dict.
            timeout_s: wall-time limit for this call (default: the pool's).

        Returns:
            ``SandboxResult``. Never raises for anything the code does.
        """
        if not isinstance(code, str):
            raise ValueError(f"code must be a str, got {type(code).__name__}")
        if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
            raise ValueError(f"timeout_s must be a positive number or None, got {timeout_s!r}")
        if self._closed:
            raise RuntimeError("PythonSandbox is closed")
        limits = self.limits.as_dict(timeout_s)
        worker: _Worker = self._state.idle.get()
        try:
            if worker.finished or not worker.alive():
                worker = self._replace(worker)
            result, worker = self._execute(worker, code, limits)
            return result
        finally:
            if self._closed:
                worker.close()
            else:
                self._state.idle.put(worker)

    def _replace(self, worker: _Worker) -> _Worker:
        """Retire ``worker`` and start a new one. If the new one fails to start, the retired
        worker is what goes back into the pool, and the next call tries again."""
        self._retire(worker)
        self.restarts += 1
        return self._spawn()

    def _execute(self, worker: _Worker, code: str,
                 limits: dict[str, Any]) -> tuple[SandboxResult, _Worker]:
        started = time.monotonic()
        reply = None
        try:
            worker.send({"op": "run", "code": code, "limits": limits})
            # the worker enforces the limit itself; the margin covers its clean-up
            reply = worker.recv(limits["timeout_s"] + 15.0)
        except (OSError, ValueError) as exc:
            logger.warning("sandbox worker %d: protocol error %s", worker.process.pid, exc)
        broken = reply is None or reply.get("limit_hit") == "sandbox_error" or not reply.get(
            "clean", True)
        if broken:
            reason = "died" if not worker.alive() else "failed or hung"
            logger.warning("sandbox worker %d %s; replacing it", worker.process.pid, reason)
            try:
                worker = self._replace(worker)
            except Exception as exc:  # the next call retries the start
                logger.warning("sandbox: could not start a replacement worker: %s", exc)
        if reply is None:
            return SandboxResult(stdout="", stderr=f"sandbox worker {reason} during the call",
                                 exit_code=None, limit_hit="sandbox_error",
                                 duration_s=time.monotonic() - started), worker
        if reply.get("setup_error"):
            reply["limit_hit"] = "sandbox_error"
        return SandboxResult(
            stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"],
            limit_hit=reply["limit_hit"], duration_s=reply["duration_s"],
            cpu_s=reply.get("cpu_s", 0.0), stdout_truncated=reply.get("stdout_truncated", False),
            stderr_truncated=reply.get("stderr_truncated", False),
        ), worker

    def run_many(
        self, codes: Iterable[str], *, timeout_s: float | None = None
    ) -> list[SandboxResult]:
        """Run many snippets over the pool (``workers`` at a time); results in input order."""
        codes = list(codes)
        for index, code in enumerate(codes):
            if not isinstance(code, str):
                raise ValueError(f"codes[{index}] must be a str, got {type(code).__name__}")
        if not codes:
            return []
        with ThreadPoolExecutor(max_workers=min(self._num_workers, len(codes))) as pool:
            return list(pool.map(lambda code: self.run(code, timeout_s=timeout_s), codes))

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers, the processes that fork the executions (for
        monitoring and tests)."""
        with self._lock:
            return [w.pid for w in self._state.workers]

    def worker_uids(self) -> list[int]:
        """Sandbox uids of the current workers (root mode)."""
        with self._lock:
            return [w.uid for w in self._state.workers]

    # --- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (idempotent). Calls in flight finish first."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                worker = self._state.idle.get_nowait()
            except queue.Empty:
                break
            worker.close()
        # workers busy in a call are closed by that call's finally clause

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PythonSandbox(workers={self._num_workers}, mode={self.isolation.get('mode')!r},"
                f" timeout_s={self.limits.timeout_s}, memory_mb={self.limits.memory_mb})")
