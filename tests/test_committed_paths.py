"""No committed text file carries an absolute path of the machine that wrote it (issue 55).

Run records, reports and docs are read on other machines: a path such as
``/work/main/runs/...``, ``/home/alice/...`` or ``/tmp/wt/src/...`` names a checkout, a home or
a scratch folder that exists only where the file was written. Paths inside the repository are
written relative to its root (``runs/...``, ``results/...``, ``src/...``), the user's cache as
``~/.cache/...``. The check covers the roots where checkouts, homes and scratch folders live
(:data:`MACHINE_ROOTS`), plus this checkout's own absolute path and this user's home, wherever
they are. System paths a file genuinely needs (``/proc``, ``/dev/shm``, ``/usr/bin``) are not
machine paths and are not matched; the few matches that are not paths of a machine either are
listed, file by file, in :data:`ALLOWED`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its examples are the pattern's tests

# Where a checkout, a home or a scratch folder lives on the machines this project meets (Linux
# and macOS): something under /work, /root, /tmp, /var/tmp, /scratch or /mnt, or a user's home
# /home/<user>, /Users/<user>. The bare folders (``/tmp``, ``/root``) are names every machine
# has (the sandbox hides them), not a path of one.
MACHINE_ROOTS = r"(?:(?:work|root|tmp|var/tmp|scratch|mnt)/|(?:home|Users)/)[\w.~-]"
# An absolute path starting there: not inside a longer path or a URL (``.../work/...``,
# ``github.com/root/x``), up to a delimiter.
MACHINE_PATH = re.compile(rf"(?<![\w.~/-])/{MACHINE_ROOTS}[^\s'\"`)<>\]|,;]*")

# file -> the matches in it that are not paths of the machine that wrote it, and why.
ALLOWED: dict[str, frozenset[str]] = {
    # the sandbox's scratch folder, a path inside the sandbox's own root (docs/sandbox.md)
    "src/gear_rl/agent/tools/_sandbox_worker.py": frozenset({"/tmp/gear-sandbox"}),
    "docs/sandbox.md": frozenset({"/tmp/gear-sandbox/run-N"}),
    # paths the sandbox tests try to write or read from inside the sandbox, to see them refused
    "tests/test_sandbox_security.py": frozenset({"/tmp/pwned", "/root/.bashrc"}),
    # placeholder strings that the tests parse or join and never create
    "tests/test_study.py": frozenset({"/tmp/x", "/tmp/x/cells/arith/gear_paper-s0"}),
    "tests/test_train_config.py": frozenset({"/tmp/x"}),
    "tests/test_integration_verl.py": frozenset({"/tmp/x"}),
    "tests/test_integration_verl_trainer.py": frozenset({"/tmp/tools.yaml"}),
    # verl's own default for Ray's Prometheus file, recorded in a verl cell's resolved config
    **{f"results/study/verl_gear_vs_grpo-cpu/cells/math/{cell}/config.yaml": frozenset(
        {"/tmp/ray/session_latest/metrics/prometheus/prometheus.yml"})
       for cell in ("grpo-s0", "gear-s0", "grpo-s1", "gear-s1")},
}

# Folders a walk skips when there is no git to list the committed files (the same ones
# .gitignore names: environments, runs, caches, build outputs).
_NOT_COMMITTED = {".git", ".venv", "runs", "build", "dist", "__pycache__", ".pytest_cache",
                  ".ruff_cache", ".mypy_cache", ".hypothesis", ".whl", ".gl"}


def committed_files(root: Path = ROOT) -> list[Path]:
    """The repository's committed files: ``git ls-files``, or, without git or outside a git
    checkout (an unpacked source archive), every file under ``root`` but the folders a checkout
    does not commit."""
    git = shutil.which("git")
    if git is not None and (root / ".git").exists():
        listed = subprocess.run([git, "ls-files", "-z"], cwd=root, capture_output=True,
                                check=True).stdout.decode("utf-8").split("\0")
        return [root / name for name in listed if name and (root / name).is_file()]
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders
                         if name not in _NOT_COMMITTED and not name.endswith(".egg-info")]
        found.extend(Path(folder) / name for name in names)
    return found


def machine_paths(text: str, own: tuple[str, ...] = ()) -> Iterator[tuple[int, str]]:
    """(line number, path) of every absolute machine path in ``text``: a path under
    :data:`MACHINE_ROOTS`, or one that starts with a folder of ``own`` (this checkout, this
    user's home)."""
    # a folder of one component (a home at /root) counts only with something under it
    own_paths = [re.compile(rf"(?<![\w.~/-]){re.escape(folder)}"
                            + (r"(?![\w.-])" if folder.count("/") > 1 else r"(?=/[\w.~-])")
                            + r"[^\s'\"`)<>\]|,;]*") for folder in own]
    for number, line in enumerate(text.splitlines(), start=1):
        found = {match.start(): match.group(0).rstrip(".:")
                 for pattern in (MACHINE_PATH, *own_paths) for match in pattern.finditer(line)}
        yield from ((number, found[start]) for start in sorted(found))


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary (a PNG, a wheel)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_the_pattern_finds_machine_paths_and_leaves_system_paths() -> None:
    found = [path for _, path in machine_paths(
        'out: /work/main/runs/a\n"argv": ["/tmp/wt/src/gear_rl/cli.py"]\n'
        "cd /home/alice/gear-rl && ls /Users/bob/x. cache /root/.cache/gear-rl\n"
        "copied to `/tmp/fresh`, the checkout /srv/ci/gear-rl/results/x",
        own=("/srv/ci/gear-rl", "/root"))]
    assert found == ["/work/main/runs/a", "/tmp/wt/src/gear_rl/cli.py", "/home/alice/gear-rl",
                     "/Users/bob/x", "/root/.cache/gear-rl", "/tmp/fresh",
                     "/srv/ci/gear-rl/results/x"]
    clean = ("runs/study/default, ~/.cache/gear-rl, /proc/1/root/, /dev/shm, /usr/bin/python, "
             "/workspace, https://github.com/root/x, src/gear_rl/work/tmp, $GEAR_RL_CACHE/tmp, "
             "the sandbox hides /tmp, /root and /home; /srv/ci/gear-rl-other")
    assert list(machine_paths(clean, own=("/srv/ci/gear-rl", "/root"))) == []


def test_no_committed_file_carries_a_machine_path() -> None:
    own = tuple(str(folder) for folder in (ROOT, Path.home()) if len(folder.parts) > 1)
    offenders = []
    for path in committed_files():
        text = _text(path)
        if text is None:
            continue
        name = path.relative_to(ROOT).as_posix()
        if name == SELF:
            continue
        allowed = ALLOWED.get(name, frozenset())
        offenders += [f"{name}:{number}: {found}" for number, found in machine_paths(text, own)
                      if found not in allowed]
    assert not offenders, (
        f"{len(offenders)} absolute path(s) of a machine in committed files (write paths "
        "inside the repository relative to its root, the home as ~; a path that is not a "
        "machine's goes in ALLOWED with its reason):\n  " + "\n  ".join(offenders[:40]))


def test_allowed_exceptions_are_still_needed() -> None:
    """An exception whose file no longer holds its path is dropped, so the list stays the
    list of what is genuinely needed."""
    for name, paths in ALLOWED.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        present = {found for _, found in machine_paths(text)}
        assert paths <= present, f"{name}: {sorted(paths - present)} no longer there"
