"""Experiment trackers: where ``log.report_to`` sends the trainer's metrics, besides
``metrics.jsonl``.

``log.report_to`` takes TRL's name and values (:data:`TRACKERS`): ``none``, ``tensorboard``,
``wandb``, ``trackio``, or a list of them. Each tracker is one class with one interface
(:class:`Tracker`: ``start`` before step 1, ``log`` per metrics record, ``finish`` at the end,
also when the run fails), and every one receives the same thing:

- the metrics under their ``metrics.jsonl`` names (:func:`tracker_metrics`: the record's
  numbers, ``step`` being the x-axis), at the training step (evaluation before training:
  step 0);
- the run's name: the run directory's name; the project: ``log.project``;
- the resolved config as ``config.yaml`` holds it, as the tracker run's config;
- the run's ``run_id`` (``run.json``), so a resumed run continues the same tracker run:
  W&B's ``id=run_id`` (with ``resume="allow"`` on a resumed run: W&B offline warns that it
  ignores it); trackio's run of the same name (``resume="allow"``,
  ``"never"`` for a new run, so two runs that share a folder name stay two trackio runs);
  TensorBoard's event files, purged of the steps after the checkpoint.

W&B (``pip install 'gear-rl[wandb]'``) and trackio (``pip install 'gear-rl[trackio]'``) are
optional and imported only when asked for. Their own settings stay theirs: ``WANDB_MODE``
(``offline`` works without an account; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads
later), ``WANDB_ENTITY``, ``TRACKIO_DIR`` (trackio's local store, ``$HF_HOME/trackio`` by
default; ``trackio show --project PROJECT`` opens its dashboard), ``TRACKIO_SPACE_ID``. W&B
writes under the run directory (``RUN_DIR/wandb/``). A tracker whose package is missing is a
config error (:func:`check_report_to`, from ``TrainConfig.validate``), and one that fails to
start is a ``ValueError`` from :func:`start_trackers`: both before step 1.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gear_rl.dataclass_config import check_one_of, shown
from gear_rl.rundir import RunDir

__all__ = [
    "TRACKERS",
    "TensorBoardTracker",
    "TrackedRun",
    "Tracker",
    "TrackioTracker",
    "WandbTracker",
    "check_report_to",
    "finish_trackers",
    "start_trackers",
    "tracker_metrics",
]

TRACKERS: tuple[str, ...] = ("none", "tensorboard", "wandb", "trackio")
"""``log.report_to``'s values: TRL's names for the trackers gear-rl writes to (``none``: only
the run directory's own files)."""


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is told about the run it records.

    Attributes:
        run: the run directory (TensorBoard's and W&B's files go inside it).
        run_id: ``run.json``'s ``run_id`` (W&B's run id; None for a run without one).
        project: ``log.project``.
        config: the resolved config, as ``config.yaml`` holds it.
        start_step: the step the run continues after (0: a new run).
        resumed: the run continues an earlier one (``resume=RUN_DIR``).
    """

    run: RunDir
    run_id: str | None
    project: str
    config: dict[str, Any]
    start_step: int
    resumed: bool

    @property
    def name(self) -> str:
        """The run's name in every tracker: its directory's name."""
        return self.run.path.resolve().name


class Tracker:
    """One tracker: :meth:`start` before step 1, :meth:`log` for each metrics record,
    :meth:`finish` at the end (after a failure too).

    Attributes:
        name: its ``log.report_to`` value.
        package: the module it imports.
        extra: gear-rl's optional extra that installs it (None: a core dependency).
    """

    name: ClassVar[str]
    package: ClassVar[str]
    extra: ClassVar[str | None] = None

    def start(self, run: TrackedRun) -> None:
        """Open (or, for a resumed run, continue) the tracker's run."""
        raise NotImplementedError

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (:func:`tracker_metrics`) at training step ``step``."""
        raise NotImplementedError

    def finish(self, failed: bool = False) -> None:
        """Flush and close; ``failed``: the run stopped on an error."""
        raise NotImplementedError

    @classmethod
    def install_hint(cls) -> str:
        """The command that installs the tracker's package."""
        return (f"pip install 'gear-rl[{cls.extra}]'" if cls.extra
                else f"pip install {cls.package}")


class TensorBoardTracker(Tracker):
    """Event files in ``RUN_DIR/tensorboard/`` (``tensorboard --logdir RUN_DIR``); a resumed
    run purges the events after its checkpoint's step."""

    name = "tensorboard"
    package = "tensorboard"

    def start(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run.run.tensorboard), purge_step=run.start_step + 1)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, failed: bool = False) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run: ``id`` the run's ``run_id`` (``resume="allow"`` when the gear-rl
    run is resumed), files under ``RUN_DIR/wandb/``; ``WANDB_MODE`` and W&B's other settings
    apply as W&B reads them."""

    name = "wandb"
    package = "wandb"
    extra = "wandb"

    def start(self, run: TrackedRun) -> None:
        import wandb

        # resume only a resumed run's: W&B offline ignores it, with a warning on every run
        self.run = wandb.init(project=run.project, name=run.name, id=run.run_id,
                              resume="allow" if run.resumed else None,
                              dir=str(run.run.path), config=run.config)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class TrackioTracker(Tracker):
    """A trackio run named after the run directory in project ``log.project``: continued
    (``resume="allow"``) when the gear-rl run is resumed, a new one otherwise; stored where
    trackio stores (``TRACKIO_DIR``, a Space with ``TRACKIO_SPACE_ID``)."""

    name = "trackio"
    package = "trackio"
    extra = "trackio"

    def start(self, run: TrackedRun) -> None:
        import trackio

        self.run = trackio.init(project=run.project, name=run.name, config=run.config,
                                resume="allow" if run.resumed else "never")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self, failed: bool = False) -> None:
        self.run.finish()


_TRACKERS: dict[str, type[Tracker]] = {
    cls.name: cls for cls in (TensorBoardTracker, WandbTracker, TrackioTracker)}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing; a module without a spec
        return False


def check_report_to(key: str, names: Sequence[str]) -> None:
    """``names`` (``log.report_to``, as a list) is a valid choice of trackers whose packages
    are installed; the ``ValueError`` names ``key``. Nothing is imported."""
    if not names:
        raise ValueError(f"{key} is empty: name the trackers ({', '.join(TRACKERS[1:])}), or "
                         "none for the run directory's files alone")
    for name in names:
        if name == "all":  # TRL's "every tracker installed": a run would depend on the machine
            raise ValueError(f"{key}=all is not supported: name the trackers "
                             f"({', '.join(TRACKERS[1:])}), so a run logs the same everywhere")
        check_one_of(key, name, TRACKERS)
    if len(set(names)) < len(names):
        raise ValueError(f"{key} names a tracker twice: {list(names)}")
    if "none" in names and len(names) > 1:
        raise ValueError(f"{key}: none cannot be combined with trackers, got {list(names)}")
    for name in names:
        cls = _TRACKERS.get(name)
        if cls is not None and not _installed(cls.package):
            raise ValueError(f"{key}: {name} needs the {shown(cls.package)} package, which is not "
                             f"installed: {cls.install_hint()}")


def start_trackers(names: Sequence[str], run: TrackedRun) -> list[Tracker]:
    """The trackers ``names`` (``log.report_to``) started on ``run``, in that order. One that
    cannot start is a ``ValueError`` naming it and why (the ones started before it are
    finished first)."""
    started: list[Tracker] = []
    try:
        for name in names:
            if name == "none":
                continue
            tracker = _TRACKERS[name]()
            try:
                tracker.start(run)
            except ImportError as error:
                raise ValueError(f"log.report_to: {name} could not be imported ({error}): "
                                 f"{tracker.install_hint()}") from error
            except Exception as error:  # the tracker's own errors (login, network, settings)
                raise ValueError(f"log.report_to: {name} could not start: "
                                 f"{type(error).__name__}: {error}") from error
            started.append(tracker)
    except BaseException:
        finish_trackers(started, failed=True)
        raise
    return started


def finish_trackers(trackers: Sequence[Tracker], *, failed: bool = False) -> None:
    """Finish every tracker (each flushes what it holds); one that fails to is a warning, so
    the others still finish and the run's own error, if any, is the one raised."""
    for tracker in trackers:
        try:
            tracker.finish(failed=failed)
        except Exception as error:
            warnings.warn(f"log.report_to: {tracker.name} did not finish cleanly: "
                          f"{type(error).__name__}: {error}", stacklevel=2)


def tracker_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` record under their names, without ``step`` (the
    trackers' x-axis)."""
    return {key: value for key, value in record.items()
            if key != "step" and isinstance(value, (int, float))}
