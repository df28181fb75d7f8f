"""A study's registration: what its cells are trained and judged under, recorded in the study
folder (``OUT/registration.json``) before its first cell trains, so a rule cannot be changed
after its results without a word.

The registered fields (:func:`registered_fields`) are everything of the study file that decides
what a cell trains under (the budget, each task's overrides, each method's estimator, overrides,
seeds and ``samples_per_prompt``) or how the finished cells are judged (``metric``,
``baseline``, ``contrasts``, ``statistics.*``, ``analysis.*``); not the name, the description,
the labels, ``keep_checkpoints``, nor the budget's :data:`~gear_rl.study.spec.CELL_FREE`
settings (threads, device, ``log.*``), which change no result.

Two rules, checked on every run of ``gear-rl study`` (``train=true`` or ``false``) and by
:func:`gear_rl.study.report.analyze_study`:

- a finished or interrupted cell must hold a run of the config the study file gives it
  (:func:`gear_rl.study.runner.plan_cells`, the cell's own ``config.yaml`` being the record of
  what it trained under): its training cannot be amended, only redone;
- once any cell has finished, a change of a registered field is refused unless it is recorded
  as an amendment (``amend="why"`` on the command line): its date, the reason, each field's
  old and new value and how many cells had finished then go into the registration, and
  ``study.md`` lists them. Before any cell finished the registration simply follows the file.

A study folder whose cells finished before registrations existed has none: its first run adopts
the study file as it is then, and says so (in ``registration.json`` and ``study.md``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gear_rl.rundir import atomic_write_text
from gear_rl.study.spec import CELL_FREE, StudySpec

__all__ = ["REGISTRATION", "field_changes", "format_changes", "note_finished",
           "read_registration", "register", "registered_fields", "require_registered"]

REGISTRATION = "registration.json"
"""The registration's file in the study folder."""


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists), so a recorded field compares equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def registered_fields(spec: StudySpec) -> dict[str, Any]:
    """The registered fields of ``spec`` (see the module docstring), as dotted keys (``metric``,
    ``budget.steps``, ``methods.gear.overrides.credit.lambda_kl``, ``statistics.confidence``,
    ...) with JSON values."""
    fields: dict[str, Any] = {"metric": spec.metric, "baseline": spec.baseline,
                              "contrasts": [list(pair) for pair in spec.contrasts]}
    fields.update({f"statistics.{k}": v for k, v in vars(spec.statistics).items()})
    fields.update({"analysis.threshold": spec.threshold, "analysis.top_tokens": spec.top_tokens})
    fields.update({f"budget.{k}": v for k, v in spec.budget.items()
                   if k.split(".", 1)[0] not in CELL_FREE})
    if spec.engine != "gear-rl":  # a gear-rl study's registration reads as it always did
        fields["engine"] = spec.engine
        fields.update({f"verl.{k}": v for k, v in spec.verl.items()})
    for task in spec.tasks:
        fields.update({f"tasks.{task.key}.overrides.{k}": v for k, v in task.overrides.items()
                       if k.split(".", 1)[0] not in CELL_FREE})
        if task.setting is not None:
            fields[f"tasks.{task.key}.setting"] = task.setting
    for method in spec.methods:
        where = f"methods.{method.key}"
        fields.update({f"{where}.estimator": method.estimator,
                       f"{where}.seeds": list(method.seeds)})
        fields.update({f"{where}.overrides.{k}": v for k, v in method.overrides.items()
                       if k.split(".", 1)[0] not in CELL_FREE})
        fields.update({f"{where}.samples_per_prompt.{k}": v
                       for k, v in method.samples_per_prompt.items()})
    return _plain(fields)


def _fingerprint(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def field_changes(before: dict[str, Any], after: dict[str, Any]
                  ) -> dict[str, tuple[Any, Any]]:
    """``key -> (old, new)`` for every registered field that differs (None: not set)."""
    return {key: (before.get(key), after.get(key)) for key in sorted(before.keys() | after.keys())
            if before.get(key) != after.get(key)}


def format_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``metric: 'mean@k' -> 'pass@k'; ...`` (``not set`` where a field is absent)."""
    def show(value: Any) -> str:
        return "not set" if value is None else repr(value)

    return "; ".join(f"{key}: {show(old)} -> {show(new)}" for key, (old, new) in changes.items())


def read_registration(out: str | Path) -> dict[str, Any] | None:
    """The study folder's registration (None: it has none yet).

    Raises:
        ValueError: the file is not a registration (damaged or hand-edited).
    """
    path = Path(out) / REGISTRATION
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"study: {path} is damaged ({error}); restore it from version control "
                         "(a study's registration is its record of what it was judged "
                         "under)") from None
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict) or not all(
            isinstance(data.get(key), kind) for key, kind in
            (("amendments", list), ("cells", dict), ("registered", str),
             ("fingerprint", str))):
        raise ValueError(f"study: {path} is not a study registration (fields, fingerprint, "
                         "registered, amendments, cells); restore it from version control")
    return data


def _write(out: Path, data: dict[str, Any]) -> None:
    atomic_write_text(out / REGISTRATION, json.dumps(data, indent=1, sort_keys=True) + "\n")


def _changed_error(out: Path, record: dict[str, Any], changes: dict[str, tuple[Any, Any]],
                   finished: int) -> ValueError:
    return ValueError(
        f"study: the study file changed since {finished} cell(s) of {out} finished under its "
        f"registration ({out / REGISTRATION}, {record['registered']}): "
        f"{format_changes(changes)}. A study's rule is fixed before its results: restore the "
        "file, or record the change as an amendment with amend=\"why\" (its date, reason and "
        "the old and new values go into the registration and study.md)")


def require_registered(spec: StudySpec, out: str | Path, finished: Iterable[str] = ()
                       ) -> dict[str, Any] | None:
    """The registration of ``out`` (None: none yet), after checking that ``spec`` is what it
    records when any cell has finished (those it lists, or the ``finished`` cell names given):
    read-only, what :func:`analyze_study <gear_rl.study.report.analyze_study>` checks before
    judging.

    Raises:
        ValueError: a registered field changed after a cell finished, and no amendment
            recorded it (naming each field with its old and new value).
    """
    out = Path(out)
    record = read_registration(out)
    if record is None:
        return None
    changes = field_changes(record["fields"], registered_fields(spec))
    seen = len(record["cells"].keys() | set(finished))
    if changes and seen:
        raise _changed_error(out, record, changes, seen)
    return record


def note_finished(out: str | Path, finished: Iterable[str]) -> None:
    """Record each of the ``finished`` cells (names) that the registration does not list yet,
    with the fingerprint of the registration it finished under."""
    out = Path(out)
    record = read_registration(out)
    if record is None:
        return
    new = [name for name in finished if name not in record["cells"]]
    if new:
        record["cells"].update({name: record["fingerprint"] for name in new})
        _write(out, record)


def register(spec: StudySpec, out: str | Path, finished: Iterable[str], *,
             amend: str | None = None) -> list[str]:
    """Check ``spec`` against the registration of the study folder ``out`` and record it:
    written first (before any cell finished, it follows the file), adopted (cells finished,
    no registration: a folder from before registrations), or amended (``amend``: the reason of
    a change after cells finished). ``finished`` names the cells finished now. Returns the lines
    to tell the user (adoption, amendment).

    Raises:
        ValueError: a registered field changed after a cell finished without ``amend``; an
            ``amend`` with nothing to amend or without a reason.
    """
    out = Path(out)
    finished = list(finished)
    if amend is not None and not amend.strip():
        raise ValueError("study: amend= must give the reason for the change")
    fields = registered_fields(spec)
    record = read_registration(out)
    lines = []
    if record is None:
        if amend is not None:
            raise ValueError(f"study: amend=: {out} has no registration yet, so nothing to "
                             "amend (this run records the study file as it is)")
        record = {"study": spec.name, "registered": _now(), "adopted": bool(finished),
                  "amendments": [], "cells": {}}
        if finished:
            lines.append(f"gear-rl study: {out} holds {len(finished)} finished cell(s) and no "
                         f"registration (they finished before gear-rl recorded one): the study "
                         f"file as it is now is adopted as their registration ({REGISTRATION}; "
                         "study.md says so)")
    else:
        changes = field_changes(record["fields"], fields)
        seen = len(record["cells"].keys() | set(finished))
        if not changes and amend is not None:
            raise ValueError(f"study: amend=: the study file has not changed since its "
                             f"registration ({out / REGISTRATION}), so nothing to amend")
        if amend is None:
            require_registered(spec, out, finished)
        if changes and amend is not None:
            record["amendments"].append({
                "date": _now(), "reason": amend.strip(), "cells_finished": seen,
                "changes": {key: {"old": old, "new": new}
                            for key, (old, new) in changes.items()}})
            lines.append(f"gear-rl study: amendment {len(record['amendments'])} recorded "
                         f"({seen} cell(s) finished): {format_changes(changes)}")
        elif changes:  # no cell finished yet: nothing was judged, the registration follows
            record["registered"] = _now()
    record["fields"], record["fingerprint"] = fields, _fingerprint(fields)
    record["cells"].update({name: record["fingerprint"] for name in finished
                            if name not in record["cells"]})
    _write(out, record)
    return lines
