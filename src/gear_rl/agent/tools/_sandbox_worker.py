"""One warm worker of :class:`gear_rl.agent.tools.PythonSandbox`.

Run as ``python -I _sandbox_worker.py`` by the pool, never imported by it: this file uses the
standard library only and must not import torch or gear_rl, so that the process stays small and
``fork`` stays cheap. It speaks newline-delimited JSON on its stdin/stdout (the pool's pipes).

Lifecycle:

0. Once per pool, ``python -I _sandbox_worker.py --plan`` (see ``plan_root``) works out what the
   sandbox's root holds for this interpreter: system software, the interpreter's binary and
   standard library, the declared packages (their package directories show nothing else), the
   requested mounts; which hidden paths must be covered. It runs in the workers' interpreter, so
   it finds that interpreter's packages.
1. The first message to a worker is the configuration, with that plan. The worker isolates
   itself once (see ``isolate``): new pid, network, mount, IPC and UTS namespaces (through a
   user namespace where it is not root); it forks, and the child, pid 1 of the new pid
   namespace, is the worker from then on (the process the pool started only waits for it). It
   builds the root on a fresh tmpfs from the plan, every bind read-only, with a minimal
   ``/dev``, a scratch tmpfs and a ``/proc`` of its own namespace (what describes the host
   masked: ``PROC_MASKED_FILES``), and ``pivot_root``s into it: the host's file system is
   detached, not hidden. A cgroup namespace and a host name of its own hide the host's cgroup
   path and name. Where the OS refuses the namespaces it falls
   back to a user namespace, and where that fails too, to no namespaces; it reports what it got.
2. Per execution it forks a child that starts a new session, gets a fresh scratch directory (its
   only writable place with ``/dev/shm``, also its cwd, HOME and TMPDIR), resource limits,
   ``no_new_privs``, a distinct unprivileged uid/gid (root mode) or no capabilities (user
   namespace), a seccomp filter, a fresh ``__main__`` module in ``sys.modules``, and then
   ``exec``s the code in that module's namespace. A set-up failure is reported on the status
   pipe (fd 3), which the child closes before the code runs: the code holds fds 0-2 only. The
   worker reads the child's stdout/stderr with a size cap, enforces the wall-time limit, and
   labels a limit from the kernel's record (wait status, CPU time) and the traceback the child
   printed (``_classify``).
3. After every execution, however it ended, everything the code started is killed (see
   ``kill_everything``): the process group first; then, if the worker still has a child,
   ``kill(-1, SIGKILL)``, which from pid 1 reaches every process of the namespace (without
   namespaces the process table is walked), and the worker reaps until it has no child left.
   Scratch, ``/dev/shm`` and SysV IPC objects are wiped.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import gc
import importlib
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import time
import traceback
import types

# --- Linux constants (stable kernel ABI) ---------------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
# SECBIT_NOROOT | _LOCKED | SECBIT_NO_SETUID_FIXUP | _LOCKED | SECBIT_KEEP_CAPS_LOCKED
# | SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED
SECUREBITS_LOCKDOWN = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
IPC_RMID = 0
_SYSCALL_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

# The child's set-up reports a failure on this descriptor, and closes it before the code runs:
# nothing the code writes can reach the worker but its stdout and stderr.
STATUS_FD = 3
# Bound here, before any sandboxed code runs: the code may overwrite ``os._exit`` or ``os.write``
# in its (forked) copy of these modules, and the child still has to print and exit.
_exit = os._exit
_write = os.write
# What the child prints after the traceback when a thread could not start, for ``_classify``.
TASKS_NOTE = "[sandbox] {tasks} processes and threads were running (at most {limit})"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


# --- protocol ------------------------------------------------------------------------------------
class Channel:
    """Newline-delimited JSON over two file descriptors."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self._buffer = b""

    def recv(self) -> dict | None:
        while b"\n" not in self._buffer:
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            written = os.write(self.write_fd, data)
            data = data[written:]


# --- the sandbox's root: what it holds (planned once per pool) -----------------------------------
# System software the interpreter and a shell need. Everything else of the host stays out: /etc but
# the loader cache, homes, /opt, /srv, /var, /usr/local (unless the interpreter lives there), ...
SYSTEM_DIRS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
               "/usr/libexec", "/usr/share")
# merged-/usr symlinks (recreated as links), or the directories themselves on older systems
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
SITE_DIR_NAMES = ("site-packages", "dist-packages")
# The code's only writable places: its scratch directory (a run-N directory in this tmpfs) and
# /dev/shm; both private to the worker and wiped after every execution.
SCRATCH_ROOT = "/tmp/gear-sandbox"
# What the sandbox's /proc does not show of the host (bound over with an empty file or directory,
# read-only): the kernel's command line, configuration, symbols and modules; the hardware (buses,
# interrupts, I/O ports and memory, DMA, disks, partitions, swaps, devices); host-wide memory,
# lock, slab, scheduler, pressure and crypto tables. ``meminfo`` shows the sandbox's own memory
# limit instead. Left visible, because the kernel tells the same through calls that cannot be
# masked (uname, sysinfo, cpuid, the clocks, sched_getaffinity) and programs read them:
# ``version``, ``cpuinfo``, ``stat``, ``loadavg``, ``uptime``.
PROC_MASKED_FILES = (
    "cmdline", "config.gz", "bootconfig", "kallsyms", "modules", "kcore", "kmsg", "keys",
    "key-users", "timer_list", "timer_stats", "latency_stats", "sched_debug", "schedstat",
    "partitions", "diskstats", "swaps", "mdstat", "devices", "misc", "consoles", "interrupts",
    "softirqs", "iomem", "ioports", "dma", "mtrr", "fb", "locks", "vmallocinfo", "slabinfo",
    "pagetypeinfo", "buddyinfo", "zoneinfo", "vmstat", "cgroups", "crypto", "kpagecount",
    "kpageflags", "kpagecgroup", "version_signature")
PROC_MASKED_DIRS = ("acpi", "asound", "bus", "driver", "dynamic_debug", "fs", "irq", "pressure",
                    "scsi", "tty")
SANDBOX_HOSTNAME = "sandbox"


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan_root(spec: dict) -> dict:
    """What the sandbox's root holds, for this interpreter (run once per pool, as
    ``python -I _sandbox_worker.py --plan``).

    ``spec``: ``packages`` (distribution or import names), ``mounts`` and ``python_path`` (real
    paths, already checked by the pool), ``hidden`` (real paths that must not show).

    Returns ``{"binds", "covers", "links", "packages", "notes"}``: directories and files bound
    read-only at their own path; package directories replaced by an empty directory (only the
    declared packages are bound back into them); symlinks recreated (path -> target). A hidden
    path under a bind is cut out: that bind is replaced by binds of its other entries, level by
    level down to the hidden path, which is then not even named. Or ``{"error": ...}`` when a
    declared package is not installed.
    """
    import glob
    import site

    binds: set[str] = set()
    links: dict[str, str] = {}
    notes: list[str] = []

    def expose(path: str) -> None:
        """Bind ``path``; a symlink on the way to it is recreated and followed, one at a time
        (the venv's ``bin/python`` -> the base interpreter), so the code resolves it the same."""
        path = os.path.abspath(path)
        for _ in range(40):
            path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
            if not os.path.islink(path):
                break
            links[path] = os.readlink(path)
            path = os.path.normpath(os.path.join(os.path.dirname(path), links[path]))
        if os.path.exists(path):
            binds.add(path)

    for path in (*SYSTEM_DIRS, *ROOT_LINKS, *ETC_FILES):
        if os.path.lexists(path):
            expose(path)
    # The interpreter: its binary, the prefix's lib directory (standard library, libpython and,
    # for conda-like prefixes, the shared libraries of the extension modules).
    expose(sys.executable)
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        for lib in ("lib", "lib64"):
            if os.path.isdir(os.path.join(prefix, lib)):
                expose(os.path.join(prefix, lib))
    # the standard library and its extension modules (in a venv, sysconfig's "platstdlib"
    # names the venv's own lib directory, which holds nothing but site-packages)
    expose(os.path.dirname(os.__file__))
    for path in sys.path:
        if os.path.basename(path) == "lib-dynload":
            expose(path)
    if sys.prefix != sys.base_prefix:
        # A virtual environment: its configuration and interpreter links only. Never its
        # directory whole: it may sit in the project checkout, beside the runs and the data.
        expose(os.path.join(sys.prefix, "pyvenv.cfg"))
        venv_bin = os.path.join(sys.prefix, "bin")
        for name in sorted(os.listdir(venv_bin)) if os.path.isdir(venv_bin) else ():
            if name.startswith("python"):
                expose(os.path.join(venv_bin, name))

    site_dirs = set()
    candidates = [*site.getsitepackages(), *site.getsitepackages([sys.base_prefix]), *sys.path,
                  *glob.glob("/usr/lib/python*/*-packages"),
                  *glob.glob("/usr/local/lib/python*/*-packages")]
    for path in candidates:
        if os.path.basename(path) in SITE_DIR_NAMES and os.path.isdir(path):
            site_dirs.add(os.path.realpath(path))
    try:
        package_paths, package_sites, resolved = _package_paths(spec.get("packages", []), notes)
    except LookupError as exc:
        return {"error": str(exc)}
    covers = {d for d in site_dirs if any(_within(d, b) for b in binds)} | package_sites
    for path in package_paths:
        expose(path)
    for path in (*spec.get("python_path", []), *spec.get("mounts", [])):
        expose(path)

    def cut_out(bind: str, hidden: str) -> None:
        binds.discard(bind)
        current = bind
        for part in os.path.relpath(hidden, bind).split(os.sep) if hidden != bind else ():
            if current in covers:
                return  # below a cover only what is bound into it shows
            for name in os.listdir(current):
                if name != part:
                    entry = os.path.join(current, name)
                    if os.path.islink(entry):
                        links[entry] = os.readlink(entry)
                    else:
                        binds.add(entry)
            current = os.path.join(current, part)

    hidden = [h for h in spec.get("hidden", []) if os.path.lexists(h)]
    while True:
        pairs = [(b, h) for h in hidden for b in binds if _within(h, b)]
        if not pairs:
            break
        cut_out(*pairs[0])

    def redundant(path: str) -> bool:
        """Already visible through a bind above it, with no cover in between."""
        return any(other != path and _within(path, other)
                   and not any(_within(k, other) and _within(path, k) for k in covers)
                   for other in binds)

    return {"binds": sorted(b for b in binds if not redundant(b)), "covers": sorted(covers),
            "links": dict(sorted(links.items())), "packages": resolved, "notes": notes}


def _package_paths(names: list[str], notes: list[str]) -> tuple[set[str], set[str], list[str]]:
    """Top-level files and directories of the named distributions and of what they require
    (extras left out), the package directories they lie in, and ``name==version`` of each.
    Raises ``LookupError`` for a declared name that is neither installed nor standard library."""
    import importlib.metadata as metadata
    import re

    paths: set[str] = set()
    sites: set[str] = set()
    resolved: list[str] = []
    seen: set[str] = set()
    stack = [(name, True) for name in names]
    while stack:
        name, declared = stack.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            owners = metadata.packages_distributions().get(name, [])
            if owners:
                dist = metadata.distribution(owners[0])
            elif name in getattr(sys, "stdlib_module_names", ()):
                continue
            elif declared:
                raise LookupError(
                    f"package {name!r} is not installed for {sys.executable}") from None
            else:
                notes.append(f"{name} (required by a declared package) is not installed")
                continue
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in seen:
            continue
        seen.add(key)
        resolved.append(f"{dist.metadata['Name']}=={dist.version}")
        site_dir = os.path.realpath(str(dist.locate_file("")))
        sites.add(site_dir)
        if dist.files is not None:
            for file in dist.files:
                parts = file.parts
                if not parts or parts[0] == ".." or os.path.isabs(str(file)):
                    continue  # scripts installed elsewhere (bin/)
                # a top-level module or __pycache__ entry alone; a package directory whole
                top = str(file) if len(parts) == 1 or parts[0] == "__pycache__" else parts[0]
                path = os.path.join(site_dir, top)
                if os.path.lexists(path):
                    paths.add(path)
        else:  # no RECORD: the names it declares, and its metadata directory
            for top in (dist.read_text("top_level.txt") or "").split():
                for candidate in (top, top + ".py"):
                    if os.path.lexists(os.path.join(site_dir, candidate)):
                        paths.add(os.path.join(site_dir, candidate))
            metadata_dir = getattr(dist, "_path", None)
            if metadata_dir is not None:
                paths.add(os.path.realpath(str(metadata_dir)))
        for requirement in dist.requires or ():
            spec, _, marker = requirement.partition(";")
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
            if match and "extra" not in marker:
                stack.append((match.group(1), False))
    return paths, sites, resolved


# --- isolation (once per worker) -----------------------------------------------------------------
def _mountinfo() -> list[tuple[int, int, str]]:
    """(mount id, parent id, mount point) for every mount, in mount order."""
    mounts = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
            mounts.append((int(fields[0]), int(fields[1]), point))
    return mounts


# statvfs flag -> mount flag, for the flags a remount must keep (a user namespace cannot clear
# them on a mount that came from the host)
_KEPT_FLAGS = ((os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, 1024),
               (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21))


def _make_read_only(point: str, device: bool = False) -> None:
    """Remount ``point`` read-only and nosuid (and nodev unless it is a device node)."""
    current = os.statvfs(point).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
    for stat_flag, mount_flag in _KEPT_FLAGS:
        if current & stat_flag:
            flags |= mount_flag
    _mount(None, point, None, flags)


def _enter_user_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1")


def _become_pid_one(channel: Channel) -> None:
    """Fork; the child, pid 1 of the new pid namespace, goes on as the worker. The parent (the
    process the pool started) only waits for it and exits as it did. The worker dies with that
    parent (``PR_SET_PDEATHSIG``), and every process of the namespace dies with the worker."""
    pid = os.fork()
    if pid:
        for fd in (channel.read_fd, channel.write_fd):
            os.close(fd)
        _pid, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def isolate(config: dict, channel: Channel) -> dict:
    """Isolate this worker process; return what is actually enforced (``GUARANTEES`` names of
    the pool, each True or False, plus the mode and notes)."""
    iso: dict = {"mode": "none", "allowlist_fs": False, "readonly_fs": False, "network": False,
                 "own_proc": False, "ipc_namespace": False, "uid_drop": False,
                 "process_limit": False, "seccomp": False, "host_info": False,
                 "kill_all": "descendants", "notes": []}
    requested = config["isolation"]
    namespaces = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    mode = "none"
    if requested == "auto" and os.geteuid() == 0:
        try:
            _check(_libc.unshare(namespaces), "unshare")
            mode = "root"
        except OSError as exc:
            iso["notes"].append(f"root namespaces refused: {exc}")
    if mode == "none" and requested in ("auto", "userns"):
        try:
            _enter_user_namespace()
            _check(_libc.unshare(namespaces), "unshare")
            mode = "userns"
        except OSError as exc:
            iso["notes"].append(f"user namespace refused: {exc}")
    iso["mode"] = mode
    if mode == "none":
        import tempfile

        try:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            iso["subreaper"] = True
        except OSError as exc:
            iso["subreaper"] = False
            iso["notes"].append(str(exc))
        iso["scratch_root"] = tempfile.mkdtemp(prefix="gear-sandbox-")
        return iso
    _become_pid_one(channel)
    iso["subreaper"] = True  # pid 1 of the namespace: every orphan in it comes back to it
    # the worker's pid as the pool sees it (the host's /proc is still mounted)
    iso["host_pid"] = int(os.readlink("/proc/self"))
    iso["uid_drop"] = mode == "root"
    iso["kill_all"] = "pid_namespace"
    # RLIMIT_NPROC counts per user and user namespace: per worker in root mode (own uid) and in
    # user-namespace mode (own namespace).
    iso["process_limit"] = True
    iso["network"] = iso["ipc_namespace"] = True
    names_hidden = _hide_host_names(iso)
    try:
        build_root(config, iso)
    except OSError as exc:  # never fall back silently: the pool refuses to start
        raise RuntimeError(f"could not build the sandbox's root in {mode} mode: {exc} "
                           "(isolation='none' runs without file-system isolation)") from exc
    iso["allowlist_fs"] = True
    # /proc masked by build_root (or no /proc at all)
    iso["host_info"] = names_hidden
    iso["scratch_root"] = SCRATCH_ROOT
    if mode == "userns":
        # the code runs as this worker's uid: keep it out of the worker's /proc entries
        # (fd, mem, root, environ need a capability the code does not have)
        _prctl(PR_SET_DUMPABLE, 0)
    return iso


def _hide_host_names(iso: dict) -> bool:
    """A cgroup namespace (``/proc/self/cgroup`` shows ``/``, not the host's cgroup path) and a
    host name of the sandbox's own in its UTS namespace (not the host's, often a container id).
    False, with a note, where the kernel refuses either."""
    import socket

    try:
        _check(_libc.unshare(CLONE_NEWCGROUP), "unshare(CLONE_NEWCGROUP)")
        socket.sethostname(SANDBOX_HOSTNAME)
        _check(_libc.setdomainname(b"(none)", 6), "setdomainname")
    except OSError as exc:
        iso["notes"].append(f"host names not hidden: {exc}")
        return False
    return True


def _mask_proc(proc: str, staging: str, memory_mb: int) -> None:
    """Bind an empty read-only file or directory over each of ``PROC_MASKED_FILES`` and
    ``PROC_MASKED_DIRS`` that ``proc`` has, and a ``meminfo`` of ``memory_mb`` over its
    ``meminfo``. The sources live on a small tmpfs that is detached again at once (the binds
    keep it); nothing of it shows in the root."""
    source = staging + "/.proc-mask"
    os.mkdir(source, 0o700)
    _mount("tmpfs", source, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           "size=64k,nr_inodes=16,mode=0755")
    try:
        os.mkdir(f"{source}/empty-dir", 0o555)
        kib = memory_mb << 10
        files = {"empty": "", "meminfo": "".join(
            f"{name + ':':<16}{value:>8} kB\n" for name, value in (
                ("MemTotal", kib), ("MemFree", kib), ("MemAvailable", kib), ("Buffers", 0),
                ("Cached", 0), ("SwapCached", 0), ("Active", 0), ("Inactive", 0),
                ("SwapTotal", 0), ("SwapFree", 0), ("Shmem", 0), ("Slab", 0),
                ("SReclaimable", 0)))}
        for name, text in files.items():
            with open(f"{source}/{name}", "w") as handle:
                handle.write(text)
            os.chmod(f"{source}/{name}", 0o444)
        targets = [(name, "empty") for name in PROC_MASKED_FILES] + [("meminfo", "meminfo")]
        targets += [(name, "empty-dir") for name in PROC_MASKED_DIRS]
        for name, what in targets:
            target = f"{proc}/{name}"
            if os.path.lexists(target) and os.path.isdir(target) == (what == "empty-dir"):
                _mount(f"{source}/{what}", target, None, MS_BIND)
                _make_read_only(target)
    finally:
        _check(_libc.umount2(source.encode(), MNT_DETACH), "umount the /proc masks' source")
        os.rmdir(source)


def build_root(config: dict, iso: dict) -> None:
    """Build the sandbox's root on a fresh tmpfs from the pool's plan, ``pivot_root`` into it
    and detach the host's. Every bind is read-only; only the scratch tmpfs and ``/dev/shm`` are
    writable. Sources are reached through ``O_PATH`` descriptors opened before anything is
    mounted, so a source under the staging directory is still found."""
    plan = config["root"]
    size = f"size={config['tmpfs_mb']}m,nr_inodes={config['tmpfs_inodes']}"
    small = "size=1m,nr_inodes=4096"
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    sources = sorted({*plan["binds"], *(f"/dev/{node}" for node in DEV_NODES)})
    handles = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in sources}
    staging = "/tmp"  # the host's /tmp is untouched: this mount lives in our namespace only
    old_umask = os.umask(0o022)
    try:
        _mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, f"{small},mode=0755")

        def place(path: str, directory: bool) -> str:
            target = staging + path
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            if directory:
                os.makedirs(target, 0o755, exist_ok=True)
            elif not os.path.lexists(target):
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            return target

        def bind(source: str, path: str, device: bool = False) -> None:
            target = place(path, stat.S_ISDIR(os.fstat(handles[source]).st_mode))
            _mount(f"/proc/self/fd/{handles[source]}", target, None, MS_BIND | MS_REC)
            _make_read_only(target, device)  # at once: nothing may write through to the host

        # parents before children; at one path a bind goes before the cover over it
        steps = [(path, 0) for path in plan["binds"]] + [(path, 1) for path in plan["covers"]]
        for path, kind in sorted(steps, key=lambda step: (step[0].count("/"), step[1], step[0])):
            if kind == 0:
                bind(path, path)
            else:
                _mount("tmpfs", place(path, True), "tmpfs", MS_NOSUID | MS_NODEV,
                       f"{small},mode=0755")
        for path, target in plan["links"].items():
            if not os.path.lexists(staging + path):
                os.makedirs(os.path.dirname(staging + path), 0o755, exist_ok=True)
                os.symlink(target, staging + path)
        _mount("tmpfs", place("/dev", True), "tmpfs", MS_NOSUID | MS_NOEXEC, f"{small},mode=0755")
        for node in DEV_NODES:
            bind(f"/dev/{node}", f"/dev/{node}", device=True)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"{staging}/dev/{name}")
        writable = ["/dev/shm", SCRATCH_ROOT]
        _mount("tmpfs", place("/dev/shm", True), "tmpfs", MS_NOSUID | MS_NODEV,
               f"{size},mode=1777")
        _mount("tmpfs", place(SCRATCH_ROOT, True), "tmpfs", MS_NOSUID | MS_NODEV,
               f"{size},mode=0755")
        # Before the host's /proc goes: in a user namespace the kernel only allows a new proc
        # mount while a fully visible one is there.
        try:
            proc = place("/proc", True)
            _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
            for name in ("sys", "sysrq-trigger"):  # kernel knobs: read-only
                if os.path.exists(f"{proc}/{name}"):
                    _mount(f"{proc}/{name}", f"{proc}/{name}", None, MS_BIND | MS_REC)
                    _make_read_only(f"{proc}/{name}")
            iso["own_proc"] = True
        except OSError as exc:  # e.g. a user namespace where the host's /proc is partly masked
            iso["notes"].append(f"no /proc in the sandbox: {exc}")
        if iso["own_proc"]:  # a failure here refuses to start, like any other of the root
            _mask_proc(staging + "/proc", staging, config["memory_mb"])
        # everything else under the new root read-only (submounts of recursive binds included)
        table = _mountinfo()
        top = [mount_id for mount_id, _parent, point in table if point == staging][-1]
        subtree, changed = {top}, True
        while changed:
            grown = subtree | {m for m, parent, _p in table if parent in subtree}
            changed, subtree = grown != subtree, grown
        failures = []
        for mount_id, _parent, point in table:
            inside = point[len(staging):] or "/"
            if mount_id not in subtree or inside in writable or _within(inside, "/proc"):
                continue
            try:
                device = inside.startswith("/dev/") and inside[5:] in DEV_NODES
                _make_read_only(point, device)
            except OSError as exc:
                failures.append(str(exc))
        iso["readonly_fs"] = not failures
        if failures:
            iso["notes"].append(f"{len(failures)} mounts stayed writable: {failures[:3]}")
        number = _SYSCALL_PIVOT_ROOT.get(platform.machine())
        if number is None:
            raise OSError(errno.ENOSYS, f"pivot_root: unknown architecture "
                                        f"{platform.machine()}; use isolation='none'")
        os.chdir(staging)
        _check(_libc.syscall(number, b".", b"."), "pivot_root")
        _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
        os.chdir("/")
    finally:
        os.umask(old_umask)
        for handle in handles.values():
            os.close(handle)
    # the worker's own imports now come from the new root: forget what the host's paths held
    sys.path[:] = [p for p in sys.path if p and os.path.exists(p)]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


# --- seccomp -------------------------------------------------------------------------------------
_SECCOMP_X86_64 = {
    # mount / namespace / privilege / kernel-attack-surface syscalls no Python snippet needs
    "ptrace": 101, "syslog": 103, "personality": 135, "vhangup": 153, "pivot_root": 155,
    "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438, "mount_setattr": 442,
    # No new sockets of any family: the empty network namespace already cuts the network, and
    # this also keeps the code away from Unix sockets that the host left world-writable.
    # socketpair (53) stays allowed: asyncio and multiprocessing pipes use it.
    "socket": 41,
}
_X86_64 = {"arch": 0xC000003E, "clone": 56, "clone3": 435, "x32_bit": 0x40000000}


def _seccomp_program() -> bytes | None:
    """A classic-BPF seccomp filter (x86_64 only): deny the syscalls above with EPERM, deny
    ``clone`` with namespace flags, make ``clone3`` return ENOSYS (libc falls back to ``clone``,
    whose flags can be checked), allow everything else."""
    if platform.machine() != "x86_64":
        return None
    ld_abs, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    ns_flags = (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
                | CLONE_NEWNET | CLONE_NEWCGROUP)
    insns: list[tuple[int, int, int, int]] = [
        (ld_abs, 0, 0, 4), (jeq, 1, 0, _X86_64["arch"]), (ret, 0, 0, kill),
        (ld_abs, 0, 0, 0),
        (0x35, 0, 1, _X86_64["x32_bit"]), (ret, 0, 0, eperm),  # jge: x32 ABI numbers
    ]
    for number in sorted(_SECCOMP_X86_64.values()):
        insns += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    insns += [(jeq, 0, 1, _X86_64["clone3"]), (ret, 0, 0, enosys)]
    # clone: inspect the low 32 bits of the flags argument
    insns += [(jeq, 0, 4, _X86_64["clone"]), (ld_abs, 0, 0, 16), (jset, 0, 1, ns_flags),
              (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    insns += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("HBBI", *insn) for insn in insns)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class PreparedFilter:
    """A seccomp program laid out in memory once, in the worker; each child only calls prctl
    (building the ctypes objects in every child costs page faults)."""

    def __init__(self, program: bytes) -> None:
        self.buffer = ctypes.create_string_buffer(program)
        self.fprog = _SockFprog(len(program) // 8, ctypes.addressof(self.buffer))
        self.address = ctypes.addressof(self.fprog)

    def install(self) -> None:
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self.address, 0, 0), "seccomp")


def _drop_capabilities() -> None:
    """User-namespace mode: the code runs as uid 0 of the namespace, so lock down root semantics
    and drop every capability (otherwise it could undo the mounts)."""
    _prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKDOWN)
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    syscall_capset = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
    if syscall_capset is None:
        raise OSError(errno.ENOSYS, "capset: unknown architecture")
    _check(_libc.syscall(syscall_capset, ctypes.byref(header), data), "capset")


# --- one execution -------------------------------------------------------------------------------
def _child(request: dict, config: dict, iso: dict, scratch: str, out_w: int, err_w: int,
           status_w: int) -> None:
    """Runs in the forked child; never returns."""
    code_status = 1
    try:
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(devnull, 0)
        os.dup2(status_w, STATUS_FD)
        os.set_inheritable(STATUS_FD, False)
        os.closerange(STATUS_FD + 1, 1 << 16)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_IGN)  # as a fresh interpreter has them
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(scratch)
        os.umask(0o077)
        # the rest of the environment was set once in the worker (see code_environment)
        os.environ["HOME"] = os.environ["TMPDIR"] = scratch
        sys.dont_write_bytecode = True
        limits = request["limits"]
        cpu = max(1, int(-(-limits["cpu_s"] // 1)))
        memory = int(limits["memory_mb"]) << 20
        file_size = int(limits["max_file_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        if iso["mode"] != "none":
            resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if iso["mode"] == "root":
            uid, gid = config["uid"], config["gid"]
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        elif iso["mode"] == "userns":
            _drop_capabilities()
        if iso["mode"] != "none":
            # a uid change (root mode) or the worker's own setting (user-namespace mode) left
            # the process non-dumpable, which turns its own /proc/self/* unreadable to it;
            # restore normal behaviour (core files stay off through RLIMIT_CORE)
            _prctl(PR_SET_DUMPABLE, 1)
        if iso["seccomp"]:
            config["_seccomp_filter"].install()
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace",  # noqa: SIM115
                          closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace",  # noqa: SIM115
                          closefd=False, buffering=1)
        sys.argv = ["<sandbox>"]
        # the code's own __main__ module, as under ``python -c``: pickle (multiprocessing's
        # Pool, ProcessPoolExecutor) finds what the code defines through sys.modules
        main = types.ModuleType("__main__")
        main.__builtins__ = __builtins__  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        os.close(STATUS_FD)  # last: the code never holds the status channel
    except BaseException as exc:  # set-up failed: report and never run the code
        try:
            os.write(2, f"sandbox set-up failed: {exc!r}\n".encode())
            os.write(STATUS_FD, json.dumps({"setup_error": repr(exc)}).encode())
        finally:
            os._exit(126)
    atexit._clear()  # handlers inherited from the worker are not the code's
    try:
        compiled = compile(request["code"], "<sandbox>", "exec")
        exec(compiled, main.__dict__)
        code_status = 0
    except SystemExit as exc:
        if exc.code is None:
            code_status = 0
        elif isinstance(exc.code, int):
            code_status = exc.code & 0xFF
        else:
            _safe_print_error(str(exc.code))
            code_status = 1
    except BaseException as exc:
        try:
            thread_refused = isinstance(exc, RuntimeError) and "new thread" in str(exc)
        except BaseException:  # the code's own __str__
            thread_refused = False
        tasks = _count_own_tasks() if thread_refused else None
        _safe_print_exception(exc)
        if tasks is not None:
            _safe_print_error(TASKS_NOTE.format(tasks=tasks, limit=limits["max_processes"]))
        code_status = 1
    try:
        # as at the end of a real interpreter: wait for non-daemon threads, run atexit handlers
        threading_module = sys.modules.get("threading")
        if threading_module is not None:
            threading_module._shutdown()
        atexit._run_exitfuncs()
    except BaseException as exc:
        _safe_print_exception(exc)
    _flush_quietly()
    _exit(code_status)


def _count_own_tasks() -> int | None:
    """Threads of every process this uid can see (root mode: exactly the sandbox's own, since
    /proc hides the rest); None when unknown."""
    total = 0
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/status") as handle:
                        for line in handle:
                            if line.startswith("Threads:"):
                                total += int(line.split()[1])
                                break
                except (OSError, ValueError):
                    continue
    except OSError:
        return None
    return total


def code_environment(config: dict) -> dict[str, str]:
    """The environment sandboxed code sees (plus per-run ``HOME`` and ``TMPDIR``). Set in the
    worker once, so children only add two variables. ``MALLOC_ARENA_MAX`` is also in the
    worker's own start-up environment (glibc reads it once): under ``RLIMIT_AS`` a handful of
    threads would otherwise exhaust the limit with 64 MiB arena reservations."""
    return {"PATH": config["path_env"], "LANG": config["lang"], "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}


def _safe_print_exception(exc: BaseException) -> None:
    # plain try/except (not contextlib): the code may have replaced modules in this process
    try:
        # a caught exception has a traceback; were it None, the AttributeError is caught below
        tb = exc.__traceback__.tb_next  # type: ignore[union-attr]
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    except BaseException:
        try:  # noqa: SIM105
            _write(2, f"{type(exc).__name__}: {exc}\n".encode(errors="replace"))
        except BaseException:
            pass


def _safe_print_error(text: str) -> None:
    try:  # noqa: SIM105
        _write(2, (text + "\n").encode(errors="replace"))
    except BaseException:
        pass


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105
            stream.flush()
        except BaseException:
            pass


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, real uid) for every visible process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as handle:
                ppid = uid = -1
                for line in handle:
                    if line.startswith("PPid:"):
                        ppid = int(line.split()[1])
                    elif line.startswith("Uid:"):
                        uid = int(line.split()[1])
                        break
            table[int(name)] = (ppid, uid)
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(root: int) -> list[int]:
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _uid) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _reap_children(deadline: float) -> bool:
    """Reap exited children until none is left (True) or the deadline passes (False)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)


def _has_children() -> bool:
    """Reap what has exited; True when the worker still has a child."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def kill_everything(iso: dict, pgid: int | None) -> bool:
    """Kill every process the execution started; True when none is left.

    The worker is pid 1 of its own pid namespace (namespace modes) or a child subreaper: every
    live process descended from the execution (also one that called ``setsid`` or whose parent
    died) is a child of the worker or below one. So once the worker has no child left, nothing
    is left, and the common case costs one ``waitpid``. Otherwise, in a pid namespace,
    ``kill(-1, SIGKILL)`` from its pid 1 reaches every other process in it; without one, the
    process table is walked and every descendant killed.
    """
    if pgid is not None:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    if iso.get("subreaper") and not _has_children():
        return True
    for _attempt in range(20):
        if iso["kill_all"] == "pid_namespace":
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        else:
            for pid in _descendants(os.getpid()):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if _reap_children(time.monotonic() + 0.5):
            return True
    return False


def _wipe_ipc() -> None:
    """Remove SysV IPC objects left in this worker's IPC namespace."""
    for kind, function in (("shm", "shmctl"), ("sem", "semctl"), ("msg", "msgctl")):
        try:
            with open(f"/proc/sysvipc/{kind}") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            try:
                ident = int(line.split()[1])
            except (IndexError, ValueError):
                continue
            if kind == "sem":
                getattr(_libc, function)(ident, 0, IPC_RMID)
            else:
                getattr(_libc, function)(ident, IPC_RMID, None)


def _empty(directory: str) -> None:
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _wipe(iso: dict, scratch: str) -> None:
    if iso["mode"] == "none":
        shutil.rmtree(scratch, ignore_errors=True)
        return
    # the whole scratch tmpfs: in user-namespace mode the code owns it and may write beside
    # its run directory
    _empty(SCRATCH_ROOT)
    _empty("/dev/shm")
    _wipe_ipc()


_FINAL_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)(?::(?: (?P<message>.*))?)?")
_ERRNO = re.compile(r"\[Errno (?P<errno>\d+)\]")
_TASKS = re.compile(re.escape(TASKS_NOTE).replace(r"\{tasks\}", r"(?P<tasks>\d+)")
                    .replace(r"\{limit\}", r"\d+"))


def _final_error(stderr: str) -> tuple[str, int | None, str, int | None] | None:
    """The exception the last traceback in ``stderr`` names on its final line: (class name
    without its module, errno shown as ``[Errno N]`` or None, message, tasks of a
    ``TASKS_NOTE`` after it or None); None when no line of the tail names one. The last such
    line, not the last line: the processes a program forked share its stderr (a fork bomb's
    children each print their own traceback)."""
    tasks = None
    for line in reversed(stderr[-4096:].split("\n")):
        note = _TASKS.fullmatch(line)
        if note:
            tasks = int(note["tasks"]) if tasks is None else tasks  # the last note printed
            continue
        match = _FINAL_LINE.fullmatch(line)
        if match:
            message = match["message"] or ""
            number = _ERRNO.match(message)
            return match["name"], int(number["errno"]) if number else None, message, tasks
    return None


def _out_of_memory(name: str, err: int | None, message: str) -> bool:
    """Whether a final exception says memory ran out: ``MemoryError`` or one of its kind by
    another name (numpy's ``_ArrayMemoryError``, "Unable to allocate 8.00 GiB for an array";
    torch's ``OutOfMemoryError``), ``[Errno 12]``, or an error that quotes ENOMEM's text
    (torch's CPU allocator: "... Error code 12 (Cannot allocate memory)")."""
    return (name.endswith("MemoryError") or err == errno.ENOMEM
            or os.strerror(errno.ENOMEM) in message)


def _classify(status_word: int, rusage, stderr: str, limits: dict) -> tuple[int, str | None]:
    """(exit code, limit hit) from what the kernel recorded (the wait status, the CPU time) and
    what the result shows: an exit status of 1 with a traceback in ``stderr`` whose exception
    is a limit's (``MemoryError``, ``[Errno 12]``, ``[Errno 11]`` from ``fork`` ...). The code
    has no other way to tell the worker anything, so a label never disagrees with the output;
    code that prints such a traceback and exits with 1 gets the label its output shows."""
    limit = None
    if os.WIFSIGNALED(status_word):
        signum = os.WTERMSIG(status_word)
        exit_code = -signum
        cpu_used = rusage.ru_utime + rusage.ru_stime if rusage else 0.0
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL
                                         and cpu_used >= limits["cpu_s"] * 0.98):
            limit = "cpu"
        elif signum == signal.SIGXFSZ:
            limit = "file_size"
        return exit_code, limit
    exit_code = os.WEXITSTATUS(status_word)
    final = _final_error(stderr) if exit_code == 1 else None
    if final is None:
        return exit_code, None
    name, err, message, tasks = final
    if _out_of_memory(name, err, message):
        limit = "memory"
    elif err == errno.EFBIG:
        limit = "file_size"
    elif err == errno.EMFILE:
        limit = "open_files"
    elif err == errno.ENOSPC or err == errno.EDQUOT:
        limit = "disk"
    elif err == errno.EAGAIN and name == "BlockingIOError":
        limit = "processes"  # fork refused (a fork short of memory says ENOMEM)
    elif name == "RuntimeError" and "new thread" in message:
        # pthread_create says EAGAIN both at the process cap and when the address space
        # has no room for another stack: tell them apart by the tasks alive at the time
        near_cap = tasks is None or tasks >= limits["max_processes"] - 1
        limit = "processes" if near_cap else "memory"
    return exit_code, limit


def execute(request: dict, config: dict, iso: dict, channel: Channel, counter: int) -> dict:
    limits = request["limits"]
    scratch = os.path.join(iso["scratch_root"], f"run-{counter}")
    os.mkdir(scratch, 0o700)
    if iso["mode"] == "root":
        os.chown(scratch, config["uid"], config["gid"])
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    # Move every object the worker holds out of the collector's reach: otherwise the child's
    # first collection walks them all, faulting in a private copy of nearly every page
    # (measured: compile("x=1") in a fresh child 4.2 ms of CPU without this, 1.05 ms with it).
    gc.freeze()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(request, config, iso, scratch, out_w, err_w, status_w)
        finally:
            _exit(127)
    for fd in (out_w, err_w, status_w):
        os.close(fd)
    deadline = started + limits["timeout_s"]
    cap = limits["max_output_bytes"]
    buffers = {out_r: bytearray(), err_r: bytearray()}
    truncated = {out_r: False, err_r: False}
    limit_hit = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    for fd in (out_r, err_r):
        poller.register(fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    poller.register(channel.read_fd, select.POLLHUP | select.POLLERR)
    open_streams = {out_r, err_r}
    status_word, rusage, exited = 0, None, False
    parent_gone = False
    while True:
        if not exited:
            done, status_word, rusage = _try_wait(pid)
            if done:
                exited = True
                break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            limit_hit = "timeout"
            break
        wait_ms = int(min(remaining, 0.05 if pidfd is None else remaining) * 1000) + 1
        events = poller.poll(wait_ms)
        for fd, _mask in events:
            if fd == channel.read_fd:
                parent_gone = True
            elif fd in open_streams:
                _read_into(fd, buffers, truncated, cap, open_streams, poller)
        if parent_gone:
            limit_hit = "timeout"
            break
        if any(truncated.values()):
            limit_hit = "output"
            break
    if not exited:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        _pid, status_word, rusage = os.wait4(pid, 0)
    child_done = time.monotonic()
    clean = kill_everything(iso, pid)
    killed = time.monotonic()
    # every writer is dead now: drain what is left in the pipes without blocking
    for fd in list(open_streams):
        os.set_blocking(fd, False)
        while fd in open_streams:
            try:
                if not _read_into(fd, buffers, truncated, cap, open_streams, None):
                    break
            except BlockingIOError:
                break
    if limit_hit is None and any(truncated.values()):
        limit_hit = "output"
    os.set_blocking(status_r, False)
    try:
        raw = os.read(status_r, 1 << 16)
    except OSError:
        raw = b""
    for fd in (out_r, err_r, status_r) + ((pidfd,) if pidfd is not None else ()):
        os.close(fd)
    try:  # only the set-up writes here (a failure), before the code runs
        report = json.loads(raw.decode()) if raw else {}
        if not isinstance(report, dict):
            report = {}
    except ValueError:
        report = {}
    stderr = bytes(buffers[err_r]).decode("utf-8", errors="replace")
    exit_code, detected = _classify(status_word, rusage, stderr, limits)
    if limit_hit is None:
        limit_hit = detected
    if limit_hit in ("timeout", "output"):
        exit_code = -signal.SIGKILL
    _wipe(iso, scratch)
    result = {
        "stdout": bytes(buffers[out_r]).decode("utf-8", errors="replace"), "stderr": stderr,
        "exit_code": exit_code, "limit_hit": limit_hit,
        "duration_s": time.monotonic() - started,
        "cpu_s": (rusage.ru_utime + rusage.ru_stime) if rusage else 0.0,
        "stdout_truncated": truncated[out_r], "stderr_truncated": truncated[err_r],
        "clean": clean,
        "timings": {"run": child_done - started, "kill": killed - child_done,
                    "total": time.monotonic() - started},
    }
    if "setup_error" in report:
        result["setup_error"] = report["setup_error"]
    if parent_gone:
        result["parent_gone"] = True
    return result


def _try_wait(pid: int):
    try:
        done, status_word, rusage = os.wait4(pid, os.WNOHANG)
    except ChildProcessError:
        return True, 0, None
    return (done == pid), status_word, rusage


def _read_into(fd, buffers, truncated, cap, open_streams, poller) -> bool:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        open_streams.discard(fd)
        if poller is not None:
            poller.unregister(fd)
        return False
    buffer = buffers[fd]
    room = cap - len(buffer)
    if len(chunk) > room:
        buffer += chunk[:max(room, 0)]
        truncated[fd] = True
    else:
        buffer += chunk
    return True


def main() -> None:
    if sys.argv[1:] == ["--plan"]:
        sys.stdout.write(json.dumps(plan_root(json.loads(sys.stdin.read()))) + "\n")
        return
    # Keep the protocol away from fds 0/1 so nothing printed by accident corrupts it.
    channel = Channel(os.dup(0), os.dup(1))
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    for fd in (channel.read_fd, channel.write_fd):
        os.set_inheritable(fd, False)
    config = channel.recv()
    if config is None:
        return
    sys.path.extend(p for p in config.get("python_path", []) if p not in sys.path)
    try:
        iso = isolate(config, channel)
        program = _seccomp_program() if config.get("seccomp", True) else None
        if program is not None:
            config["_seccomp_filter"] = PreparedFilter(program)
            iso["seccomp"] = True
        os.environ.clear()
        os.environ.update(code_environment(config))
        for module in config.get("preload", []):
            __import__(module)
    except BaseException as exc:
        channel.send({"ready": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()})
        return
    iso["uid"] = config["uid"] if iso["mode"] == "root" else os.getuid()
    iso["network"] = iso["network"] and _network_is_empty()
    channel.send({"ready": True, "isolation": iso, "pid": iso.get("host_pid", os.getpid())})
    counter = 0
    while True:
        request = channel.recv()
        if request is None or request.get("op") == "exit":
            if iso["mode"] == "none":
                shutil.rmtree(iso["scratch_root"], ignore_errors=True)
            return
        counter += 1
        try:
            result = execute(request, config, iso, channel, counter)
        except BaseException as exc:
            result = {"stdout": "", "stderr": f"sandbox worker error: {exc!r}", "exit_code": None,
                      "limit_hit": "sandbox_error", "duration_s": 0.0, "clean": False,
                      "traceback": traceback.format_exc()}
        if result.get("parent_gone"):
            return
        channel.send(result)
        if not result.get("clean", True):
            return  # something survived the kill: let the pool replace this worker


def _network_is_empty() -> bool:
    """True when this network namespace has only a loopback interface and it is down."""
    import fcntl
    import socket

    try:
        names = [name for _index, name in socket.if_nameindex()]
        if names != ["lo"]:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            request = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(probe, 0x8913, request))[1]
        return not flags & 0x1  # IFF_UP
    except OSError:
        return False


if __name__ == "__main__":
    main()
