"""The run directory: its layout, its atomic writes and its readers, in one place.

A run of ``gear-rl train`` lives in one folder::

    RUN_DIR/
      config.yaml         the resolved TrainConfig (what resume and compare read)
      run.json            facts of the run (its run_id, the fingerprint of its data files and
                          problems, task sizes, device, processor, dtypes, torch version,
                          argv; ``resumes``: where each resume continued it)
      metrics.jsonl       one JSON object per step (and per evaluation)
      samples.jsonl       a few trajectories per step with their per-token signals
      summary.json        written when the run finishes (its absence marks an unfinished run)
      checkpoints/        step-NNNNNN/ folders and the one-line pointer ``latest`` (which
                          may name only one of these folders)
      tensorboard/        TensorBoard event files (``log.report_to`` names tensorboard)
      wandb/              Weights & Biases' own folder (``log.report_to`` names wandb)
      credit_check/       ``gear-rl credit-check RUN_DIR``'s folder (its default ``out``):
        credit_check.md     the tables
        credit_check.json   every number, and the scored trajectories token by token
        credit_check.png    per-token Monte-Carlo advantage beside each estimator's
        trajectories.json   the sampled prompt groups (written once)
        values.jsonl        one Monte-Carlo truth per trajectory, appended as each completes

The trainer writes it, ``gear-rl report`` / ``compare`` read it, checkpoints are saved inside
it, and the credit check writes its folder inside it (or anywhere else, ``out=``); every module
that touches a run directory, or names a file in one, goes through the names and functions
here. Whole files are written atomically (temporary file in the same folder, fsync, rename,
fsync of the folder), and the line-oriented logs are appended one complete line at a time; a
write that fails (a full disk) raises an ``OSError`` naming the file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, TextIO

import yaml

from gear_rl.dataclass_config import check_output_folder, load_yaml
from gear_rl.safe_json import loads_bounded

__all__ = [
    "CHECKPOINTS",
    "CONFIG",
    "CREDIT_CHECK_DIR",
    "CREDIT_CHECK_JSON",
    "CREDIT_CHECK_MD",
    "CREDIT_CHECK_PNG",
    "CREDIT_CHECK_TRAJECTORIES",
    "CREDIT_CHECK_VALUES",
    "DISK_FULL",
    "EVAL_RECORDS",
    "LOCK",
    "METRICS",
    "RUN_INFO",
    "RUN_STATES",
    "SAMPLES",
    "SUMMARY",
    "TENSORBOARD",
    "WANDB",
    "RunDir",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_text",
    "checkpoint_problem",
    "cpu_flags",
    "cpu_model",
    "file_sha256",
    "fsync_folder",
    "fsync_path",
    "machine_label",
    "read_eval_records",
    "read_jsonl",
    "trained_on",
    "usable_cores",
    "write_eval_records",
    "write_manifest",
]

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
"""The ``OSError.errno`` values of a full disk (or a spent quota): what every writer of a run
directory reports as "no space left"."""
CONFIG = "config.yaml"
RUN_INFO = "run.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
WANDB = "wandb"
"""W&B's folder: ``wandb.init(dir=RUN_DIR)`` writes its runs into ``RUN_DIR/wandb/``."""
LATEST = "latest"
LOCK = ".lock"
"""The lock file of a folder one process writes at a time (:meth:`RunDir.lock`)."""
MANIFEST = "manifest.json"

# The credit check's folder (gear_rl.credit_check writes it, gear_rl.report reads it).
CREDIT_CHECK_DIR = "credit_check"
"""Where ``gear-rl credit-check RUN_DIR`` writes by default (``RUN_DIR/credit_check/``), and
where ``gear-rl report`` looks for it."""
CREDIT_CHECK_JSON = "credit_check.json"
CREDIT_CHECK_MD = "credit_check.md"
CREDIT_CHECK_PNG = "credit_check.png"
CREDIT_CHECK_TRAJECTORIES = "trajectories.json"
CREDIT_CHECK_VALUES = "values.jsonl"
CREDIT_CHECK_MC_ROWS = "mc_rows.jsonl"

RUN_STATES = ("new", "finished", "interrupted", "no_checkpoint")
"""What a planned run folder can hold (:meth:`RunDir.state`)."""
RESUMES = "resumes"
"""``run.json``'s list of where each resume of the run trained (:meth:`RunDir.record_resume`)."""


def machine_label(facts: dict[str, Any]) -> str:
    """``"<processor>, <precision>"`` from a run's facts (``run.json``, or one of its
    ``resumes``): ``precision: auto`` resolves per machine (bf16 autocast where bf16 is native,
    fp32 where it is emulated), and the same weights sample differently under the two, so
    results record where they trained. A sampler whose dtype is not the training precision's
    (``rollout.dtype`` set apart from ``precision``) is named, ``"..., fp32, sampler bf16"``.
    Facts from before either was recorded say so."""
    precision = ("bf16 autocast" if facts.get("autocast_bf16")
                 else "fp32" if "autocast_bf16" in facts else "precision not recorded")
    sampler = {"torch.bfloat16": "bf16", "torch.float32": "fp32"}.get(
        str(facts.get("sampler_dtype")), str(facts.get("sampler_dtype")))
    if "sampler_dtype" in facts and "autocast_bf16" in facts and not precision.startswith(
            sampler):
        precision += f", sampler {sampler}"
    return f"{facts.get('cpu', 'processor not recorded')}, {precision}"


def trained_on(info: dict[str, Any]) -> list[str]:
    """Every :func:`machine_label` a run trained under, in order, each once: where it started
    (``info``, its ``run.json``) and where each resume continued it (``info["resumes"]``). More
    than one means the run changed machine or precision part-way."""
    labels: list[str] = []
    resumes = info.get(RESUMES)
    for facts in [info, *(resumes if isinstance(resumes, list) else [])]:
        label = machine_label(facts) if isinstance(facts, dict) else None
        if label is not None and label not in labels:
            labels.append(label)
    return labels


def fsync_path(path: str | Path) -> None:
    """Flush a file or a folder to disk (``fsync``). A file's: its bytes; a folder's: the
    creation, renaming and removal of its entries, without which a renamed file can come back
    under its old name (or not at all) after a power loss."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_folder(folder: str | Path) -> None:
    """:func:`fsync_path` every file directly in ``folder``, then the folder itself."""
    folder = Path(folder)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            fsync_path(path)
    fsync_path(folder)


def atomic_write_bytes(path: str | Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename, so a
    reader (or a crash) never leaves a half-written file; ``fsync`` makes the bytes durable
    before the rename, and the rename itself durable (the folder's fsync) before returning.
    An ``OSError`` (a full disk) names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        if fsync:
            fsync_path(path.parent)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)
        raise


def atomic_write_text(path: str | Path, text: str, *, fsync: bool = True) -> None:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def read_jsonl(path: str | Path, *, drop_partial_last: bool = False) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file, one per non-empty line ([] when the file is
    missing), read by :func:`gear_rl.safe_json.loads_bounded`. A malformed line (nested past
    its bound included) raises ``ValueError`` naming the file and line, except, with
    ``drop_partial_last``, an unterminated last line (what a write cut short leaves), which is
    dropped with a warning."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text at byte {error.start}") from error
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = loads_bounded(line)
        except json.JSONDecodeError as error:
            partial = number == len(lines) and not text.endswith("\n")
            if drop_partial_last and partial:
                warnings.warn(f"{path}:{number}: dropping a half-written last line (an "
                              "interrupted write)", stacklevel=2)
                break
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
        except ValueError as error:  # nested past the bound
            raise ValueError(f"{path}:{number}: not usable JSON ({error})") from error
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got "
                             f"{type(record).__name__}")
        out.append(record)
    return out


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line (written with a single ``write`` call); an ``OSError`` (a
    full disk) names ``path``."""
    try:
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: str | Path) -> None:
    """Record the size and SHA-256 of every file in a checkpoint folder (``manifest.json``)."""
    folder = Path(folder)
    files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    atomic_write_text(folder / MANIFEST, json.dumps({"files": files}, indent=1) + "\n")


def checkpoint_problem(folder: str | Path, *, checksums: bool = True) -> str | None:
    """Why the checkpoint ``folder`` cannot be used, or None when it is intact (every file of
    its manifest present with its size and, with ``checksums``, its SHA-256). A folder without
    a manifest is accepted when its ``state.pt`` exists. A file that disappears while it is
    checked (a trainer pruning the folder) is reported missing."""
    folder = Path(folder)
    if not (folder / "state.pt").is_file():
        return "no state.pt"
    manifest = folder / MANIFEST
    try:
        files = json.loads(manifest.read_text())["files"]
    except FileNotFoundError:
        return None if (folder / "state.pt").is_file() else "no state.pt"
    except (ValueError, KeyError, TypeError):
        return "an unreadable manifest.json"
    for name, entry in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
            if size != entry["size"]:
                return f"{name} has {size} bytes, not {entry['size']}"
            if checksums and file_sha256(path) != entry["sha256"]:
                return f"{name} does not match its checksum"
        except FileNotFoundError:
            return f"{name} is missing"
    return None


class RunDir:
    """One run directory (see the module docstring for the layout).

    Args:
        path: the folder (created by :meth:`create`, or an existing run).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock: TextIO | None = None

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # ---- paths
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def wandb(self) -> Path:
        return self.path / WANDB

    # ---- facts
    def is_run(self) -> bool:
        """Whether the folder holds a gear-rl run (its ``config.yaml``)."""
        return self.config_path.is_file()

    def has_checkpoint(self) -> bool:
        return self.checkpoints.exists()

    def finished(self) -> bool:
        """Whether the run wrote its summary (it completed every configured step)."""
        return self.summary_path.is_file()

    def state(self) -> str:
        """What the folder holds, one of :data:`RUN_STATES`: ``new`` (no run yet), ``finished``
        (its ``summary.json``), ``interrupted`` (a checkpoint to resume from) or
        ``no_checkpoint`` (a run interrupted before its first checkpoint)."""
        if not self.is_run():
            return "new"
        if self.finished():
            return "finished"
        return "interrupted" if self.latest_checkpoint() is not None else "no_checkpoint"

    # ---- one writer at a time
    def lock(self, user: str = "trainer") -> None:
        """Take the run directory for this process (an exclusive ``flock`` on ``.lock``, held
        until :meth:`unlock` or the process ends). A second trainer on the same folder gets a
        ``ValueError`` instead of interleaving its steps into the same logs; ``user`` names
        what holds such folders in that message (``"credit check"``, ``"gear-rl study"``)."""
        if self._lock is not None:
            return
        handle = (self.path / LOCK).open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise ValueError(f"out: {self.path} is in use by another {user} ({holder}); "
                                 "wait for it to finish or choose another out") from None
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def claim_new(self) -> None:
        """Make this folder a new run's and lock it (:meth:`lock`), refusing one a new run must
        not write into: a file, an unwritable path, a folder holding another run, or a
        non-empty folder that is not a run (its files would be overwritten). The lock comes
        before the contents check, so a second trainer is told the folder is in use."""
        check_output_folder(self.path, "out")  # the check of every command's output folder
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"out: cannot create {self.path}: {error.strerror}") from error
        self.lock()
        try:
            if self.has_checkpoint():
                raise ValueError(f"out: {self.path} already holds a run; pass "
                                 f"resume={self.path} to continue it, or choose another out")
            if any(p.name != LOCK for p in self.path.iterdir()):
                what = ("holds a run that stopped before its first checkpoint" if self.is_run()
                        else "is not empty and holds no gear-rl run")
                raise ValueError(f"out: {self.path} {what}; its files would be overwritten: "
                                 "remove it or choose another out")
        except BaseException:
            self.unlock()
            raise

    def discard_new(self) -> None:
        """Remove a new run that never reached its first step (a tracker that failed to
        start), folder and all, and unlock it. Only for a folder :meth:`claim_new` took: it
        held nothing else, so everything in it is the new run's."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.unlock()

    # ---- writing
    def create(self, config: dict[str, Any], info: dict[str, Any]) -> None:
        """Start a new run here: the resolved config, the run facts, empty logs."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.write_config(config)
        atomic_write_text(self.path / RUN_INFO, json.dumps(info, indent=2) + "\n")
        for name in (METRICS, SAMPLES):
            atomic_write_text(self.path / name, "")

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.config_path, yaml.safe_dump(config, sort_keys=False))

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, record)

    def append_sample(self, record: dict[str, Any]) -> None:
        append_jsonl(self.samples_path, record)

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2) + "\n")

    def truncate_logs(self, last_step: int) -> None:
        """Drop the metrics and samples of steps after ``last_step`` (logged by an interrupted
        run after its last checkpoint), atomically."""
        for path in (self.metrics_path, self.samples_path):
            if not path.is_file():
                continue
            kept = [json.dumps(r) for r in read_jsonl(path, drop_partial_last=True)
                    if r["step"] <= last_step]
            atomic_write_text(path, "".join(line + "\n" for line in kept))

    # ---- reading
    def read_info(self) -> dict[str, Any]:
        """``run.json``, the run's facts (device, precision, processor...); {} when absent."""
        path = self.path / RUN_INFO
        if not path.is_file():
            return {}
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return loaded

    def record_resume(self, facts: dict[str, Any]) -> None:
        """Add where a resume continues the run (its step, processor, precision...) to
        ``run.json``'s ``resumes`` list (:func:`trained_on` reads it)."""
        info = self.read_info()
        resumes = info.get(RESUMES)
        info[RESUMES] = [*(resumes if isinstance(resumes, list) else []), facts]
        atomic_write_text(self.path / RUN_INFO, json.dumps(info, indent=2) + "\n")

    def read_config(self) -> dict[str, Any]:
        """``config.yaml`` as a dict ({} when absent)."""
        if not self.config_path.is_file():
            return {}
        loaded = load_yaml(self.config_path.read_text(encoding="utf-8"),
                           f"run config {str(self.config_path)!r}")
        if loaded is None:
            return {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{self.config_path}: expected a mapping")
        return loaded

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path, drop_partial_last=True)

    def read_samples(self) -> list[dict[str, Any]]:
        return read_jsonl(self.samples_path)

    def read_summary(self) -> dict[str, Any]:
        """``summary.json`` ({} when absent: an unfinished run)."""
        if not self.summary_path.is_file():
            return {}
        try:
            return json.loads(self.summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.summary_path}: not valid JSON ({error.msg})") from error

    # ---- checkpoints (the format itself: gear_rl.train.checkpoint)
    def checkpoint_folder(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}"

    def point_latest(self, folder: Path) -> None:
        """Make ``checkpoints/latest`` name ``folder`` (atomically)."""
        atomic_write_text(self.checkpoints / LATEST, folder.name + "\n")

    def latest_checkpoint(self, *, verify: bool = False) -> Path | None:
        """The folder ``checkpoints/latest`` names, or None when there is no complete one.

        With ``verify`` (resume, evaluation): the checkpoint's files are checked against its
        manifest, and when it is damaged, or the pointer is empty or names nothing, the newest
        intact checkpoint is returned instead, with a warning that says so.

        Raises:
            ValueError: the pointer names something other than one of this run's own
                ``step-NNNNNN`` folders (a path, a folder elsewhere, a link out of the run).
        """
        pointer = self.checkpoints / LATEST
        named = None
        if pointer.is_file():
            text = pointer.read_text().strip()
            named = self.checkpoints / text if text else None
            if named is not None and (Path(text).name != text or not text.startswith("step-")
                                      or named.is_symlink()
                                      or named.resolve().parent != self.checkpoints.resolve()):
                raise ValueError(
                    f"{pointer} names {text!r}, which is not one of this run's checkpoint "
                    f"folders ({self.checkpoints}/step-NNNNNN): a run resumes and is evaluated "
                    "only from its own checkpoints; write the name of one of them into it, or "
                    "delete it to use the newest intact one")
        if not verify:
            return named if named is not None and (named / "state.pt").is_file() else None
        problem = "checkpoints/latest is missing or empty"
        if named is not None:
            problem = checkpoint_problem(named) or ""
            if not problem:
                return named
            problem = f"{named.name}: {problem}"
        for folder in reversed(self.checkpoint_folders()):
            if folder != named and checkpoint_problem(folder) is None:
                if named is not None or pointer.is_file():
                    warnings.warn(f"{self.path}: {problem}; using the newest intact checkpoint, "
                                  f"{folder.name}", stacklevel=2)
                return folder
        return None

    def checkpoint_folders(self) -> list[Path]:
        """This run's checkpoint folders (``step-NNNNNN``, not links to folders elsewhere),
        oldest first."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.iterdir()
                      if p.is_dir() and not p.is_symlink() and p.name.startswith("step-"))


# ---- where a run trained, and its held-out records
def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``; else what :mod:`platform` knows): bf16
    is native on some of the machines this project runs on and emulated on others, so results
    record it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The processor's feature flags (``/proc/cpuinfo``'s ``flags``, or ``Features`` on Arm;
    empty elsewhere): which of bf16's fast paths (AMX, AVX-512 BF16) the machine has."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says; else the count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


EVAL_RECORDS = "eval_records"
"""The folder of a run directory holding the per-problem records of each evaluation."""


def _records_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / EVAL_RECORDS / f"step-{step:06d}.json"


def write_eval_records(run_dir: str | Path, step: int, result: dict[str, Any], *, k: int,
                       seed: int) -> Path:
    """Store the per-problem ``records`` of one :func:`evaluate` ``result`` at training
    ``step`` as ``RUN_DIR/eval_records/step-NNNNNN.json`` (atomically; an existing file of the
    same step, left by an interrupted run that is resumed, is replaced). Returns its path."""
    path = _records_path(run_dir, step)
    atomic_write_text(path, json.dumps({"step": step, "k": k, "seed": seed,
                                        "records": result["records"]}) + "\n")
    return path


def read_eval_records(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Every evaluation's records of a run directory: step -> ``{"step", "k", "seed",
    "records"}`` ({} when the run stored none). A malformed file raises ``ValueError`` naming
    it."""
    folder = Path(run_dir) / EVAL_RECORDS
    out: dict[int, dict[str, Any]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("step-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            step, records = int(data["step"]), data["records"]
            if not isinstance(records, list) or not all(
                    isinstance(r, dict) and isinstance(r.get("rewards"), list) for r in records):
                raise TypeError("records must be a list of objects with rewards")
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: not an eval records file ({error})") from error
        out[step] = data
    return out
