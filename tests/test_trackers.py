"""``log.report_to``: TensorBoard, Weights & Biases (offline) and trackio (its local store)
record what ``metrics.jsonl`` holds, under the same names, at the same steps; a resumed run
continues the same tracker runs; a bad value, a missing package or a tracker that cannot start
stops the run before step 1 and leaves no run folder; the retired ``log.tensorboard`` switch
still loads. Every check reads back what the tracker itself stored (W&B's ``.wandb`` file,
trackio's SQLite store, TensorBoard's event files), never a stand-in."""

from __future__ import annotations

import json
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import tiny_trainer
from gear_rl.train.config import config_from_dict, config_to_dict, load_config
from gear_rl.train.resume import config_differences, resume_config

pytestmark = pytest.mark.usefixtures("one_thread", "offline_trackers")

TRACKIO = "trackio is not installed (pip install 'gear-rl[trackio]')"


@pytest.fixture(scope="module")
def offline_trackers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """W&B offline, with its settings and caches, and trackio's local store in a temporary
    folder, set before either package is imported (trackio reads ``TRACKIO_DIR`` then)."""
    home = tmp_path_factory.mktemp("trackers")
    patch = pytest.MonkeyPatch()
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                        "WANDB_CONFIG_DIR": home / "wandb-config",
                        "WANDB_CACHE_DIR": home / "wandb-cache",
                        "WANDB_DATA_DIR": home / "wandb-data", "TRACKIO_DIR": home / "trackio",
                        "HF_HUB_OFFLINE": "1"}.items():
        patch.setenv(name, str(value))
    patch.delenv("WANDB_DIR", raising=False)
    # trackio copies TRACKIO_DIR into its modules when imported: where another test (or a
    # package) imported it already, point those copies at the temporary store too, so that no
    # test writes into the user's own ~/.cache/huggingface/trackio
    for name, module in list(sys.modules.items()):
        if (name == "trackio" or name.startswith("trackio.")) and hasattr(module, "TRACKIO_DIR"):
            patch.setattr(module, "TRACKIO_DIR", home / "trackio")
    yield home
    patch.undo()


def _train(out: Path, *overrides: str) -> tuple[Any, list[dict[str, Any]]]:
    trainer = tiny_trainer(out, "log.checkpoint_every=1", "eval.at_start=true", *overrides)
    trainer.train()
    return trainer, _metrics(out)


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}


def _expected(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """What every tracker should hold: each step's numbers under their metrics.jsonl names."""
    return {record["step"]: _numbers(record) for record in records}


# --- reading back what each tracker stored --------------------------------------------------


def _wandb_records(run_dir: Path) -> list[Any]:
    """Every record of every offline W&B run under ``RUN_DIR/wandb/``, oldest run first."""
    import wandb
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    # run.finish() returns before W&B's service process has written the run's file (seen
    # with wandb 0.29: a file of 7 bytes, or none yet); stopping the service waits for it, as
    # the process's own exit does
    wandb.teardown()
    records = []
    runs = sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.stat().st_mtime)
    assert runs, f"no offline W&B run under {run_dir / 'wandb'}"
    for folder in runs:
        (path,) = folder.glob("run-*.wandb")
        store = datastore.DataStore()
        store.open_for_scan(str(path))
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            records.append(record)
    return records


def _wandb_history(records: list[Any]) -> dict[int, dict[str, float]]:
    history: dict[int, dict[str, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                   for item in record.history.item}
            step = int(row.pop("_step"))
            # W&B's own columns; a step logged again after a resume keeps its first values
            history.setdefault(step, {k: v for k, v in row.items() if not k.startswith("_")})
    return history


def _wandb_runs(records: list[Any]) -> list[Any]:
    return [r.run for r in records if r.WhichOneof("record_type") == "run"]


def _trackio_history(project: str, name: str) -> dict[int, dict[str, float]]:
    from trackio.sqlite_storage import SQLiteStorage

    history: dict[int, dict[str, float]] = {}
    for row in SQLiteStorage.get_logs(project, name):
        row = dict(row)
        step = int(row.pop("step"))
        row.pop("timestamp", None)
        history.setdefault(step, row)
    return history


def _tensorboard_history(run_dir: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    history: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            history.setdefault(event.step, {})[tag] = event.value
    return history


def _assert_same(stored: dict[int, dict[str, float]], expected: dict[int, dict[str, float]],
                 *, rel: float = 0.0) -> None:
    assert sorted(stored) == sorted(expected)
    for step, numbers in expected.items():
        assert sorted(stored[step]) == sorted(numbers), step
        for key, value in numbers.items():
            assert stored[step][key] == pytest.approx(value, rel=rel, abs=0.0), (step, key)


# --- the trackers store what metrics.jsonl holds ---------------------------------------------


def test_tensorboard_and_wandb_store_the_metrics_jsonl_records(tmp_path) -> None:
    out = tmp_path / "run"
    trainer, records = _train(out, "log.report_to=[tensorboard,wandb]", "log.project=p1")
    expected = _expected(records)
    assert sorted(expected) == [0, 1, 2] and "eval/mean@1" in expected[2]
    assert "time/step" in expected[1] and "memory/rss_gb" in expected[1]
    # TensorBoard keeps float32: the names and steps exactly, the values to float32
    _assert_same(_tensorboard_history(out), expected, rel=1e-6)
    wandb_records = _wandb_records(out)
    _assert_same(_wandb_history(wandb_records), expected)
    (run,) = _wandb_runs(wandb_records)
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert (run.run_id, run.display_name, run.project) == (run_id, "run", "p1")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert {k: v for k, v in config.items() if k != "_wandb"} == saved
    exits = [r.exit.exit_code for r in wandb_records if r.WhichOneof("record_type") == "exit"]
    assert exits == [0]
    assert trainer.trackers == []  # finished and dropped when the run ended
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trackers"] == ["tensorboard", "wandb"]


def test_trackio_stores_the_metrics_jsonl_records(tmp_path, offline_trackers) -> None:
    pytest.importorskip("trackio", reason=TRACKIO)
    out = tmp_path / "run"
    _, records = _train(out, "log.report_to=trackio", "log.project=p2")
    _assert_same(_trackio_history("p2", "run"), _expected(records))
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_project_db_path("p2").parent == offline_trackers / "trackio"
    config = SQLiteStorage.get_run_config("p2", "run") or {}
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert {k: v for k, v in config.items() if not k.startswith("_")} == saved
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists()


def test_none_writes_nothing_but_the_run_directory(tmp_path) -> None:
    out = tmp_path / "run"
    trainer, _ = _train(out, "log.report_to=none")
    assert trainer.trackers == []
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock", "checkpoints", "config.yaml", "metrics.jsonl", "run.json", "samples.jsonl",
        "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# --- resume, crash ---------------------------------------------------------------------------


def test_a_resumed_run_continues_its_tracker_runs(tmp_path) -> None:
    names = ["tensorboard", "wandb"]
    try:
        import trackio  # noqa: F401

        names.append("trackio")
    except ImportError:
        pass
    out = tmp_path / "run"
    _train(out, f"log.report_to=[{','.join(names)}]", "log.project=p3")
    trainer = tiny_trainer(out, config=resume_config(out, {"steps": 3}))
    assert trainer.start_step == 2
    trainer.train()
    expected = _expected(_metrics(out))
    assert sorted(expected) == [0, 1, 2, 3]
    records = _wandb_records(out)
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    # one W&B run id across both sessions (offline: two files that `wandb sync` joins)
    assert [run.run_id for run in _wandb_runs(records)] == [run_id, run_id]
    _assert_same(_wandb_history(records), expected)
    _assert_same(_tensorboard_history(out), expected, rel=1e-6)
    if "trackio" in names:
        from trackio.sqlite_storage import SQLiteStorage

        assert [r["name"] for r in SQLiteStorage.get_run_records("p3")] == ["run"]
        _assert_same(_trackio_history("p3", "run"), expected)


def test_a_crashed_run_flushes_its_trackers_and_wandb_marks_it_failed(tmp_path,
                                                                      monkeypatch) -> None:
    out = tmp_path / "run"
    trainer = tiny_trainer(out, "log.report_to=[wandb,tensorboard]", "steps=3")
    update = trainer.update

    def update_then_stop(batch, scores, credit, step):
        if step == 2:
            raise KeyboardInterrupt
        return update(batch, scores, credit, step)

    monkeypatch.setattr(trainer, "update", update_then_stop)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    expected = _expected(_metrics(out))
    assert sorted(expected) == [1]
    records = _wandb_records(out)
    _assert_same(_wandb_history(records), expected)
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [1]
    _assert_same(_tensorboard_history(out), expected, rel=1e-6)


# --- errors before step 1 --------------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ("wandb2", "log.report_to must be one of ('none', 'tensorboard', 'wandb', 'trackio'), got "
               "'wandb2'; did you mean 'wandb'?"),
    ("[]", "log.report_to is empty"),
    ("all", "log.report_to=all is not supported"),
    ("[none,wandb]", "log.report_to: none cannot be combined with trackers"),
    ("[wandb,tensorboard,wandb]", "log.report_to names a tracker twice"),
])
def test_a_bad_report_to_is_a_config_error(tmp_path, value, message) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        tiny_trainer(tmp_path / "run", f"log.report_to={value}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("package", ["wandb", "trackio"])
def test_a_missing_package_is_a_config_error_naming_the_extra(tmp_path, monkeypatch,
                                                              package) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # what `import` sees when it is absent
    with pytest.raises(ValueError) as error:
        tiny_trainer(tmp_path / "run", f"log.report_to=[tensorboard,{package}]")
    assert str(error.value) == (f"log.report_to: {package} needs the {package!r} package, "
                                f"which is not installed: pip install 'gear-rl[{package}]'")
    assert not (tmp_path / "run").exists()


def test_the_cli_reports_a_missing_package_before_making_a_run(tmp_path, monkeypatch,
                                                               capsys) -> None:
    from gear_rl.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    status = main(["train", "model=tiny-random", f"out={tmp_path / 'run'}",
                   "log.report_to=wandb"])
    assert status == 2
    assert "gear-rl train: log.report_to: wandb needs the 'wandb' package" in (
        capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_tracker_that_cannot_start_stops_the_run_before_step_1(tmp_path) -> None:
    # a project name W&B refuses: wandb.init raises, after TensorBoard has started
    with pytest.raises(ValueError, match=r"^log\.report_to: wandb could not start: UsageError: "
                                         r"Invalid project name 'a/b'"):
        tiny_trainer(tmp_path / "run", "log.report_to=[tensorboard,wandb]", "log.project=a/b")
    assert not (tmp_path / "run").exists()  # the new run's folder is removed, nothing kept
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_resume_whose_tracker_cannot_start_keeps_the_run(tmp_path) -> None:
    out = tmp_path / "run"
    _train(out, "log.report_to=none")
    before = sorted(p.name for p in out.iterdir())
    config = resume_config(out, {"steps": 3, "log.report_to": "wandb", "log.project": "a/b"})
    with pytest.raises(ValueError, match="wandb could not start"):
        tiny_trainer(out, config=config)
    assert sorted(p.name for p in out.iterdir() if p.name != "wandb") == before
    # the folder is unlocked: the run resumes once the tracker starts
    trainer = tiny_trainer(out, config=resume_config(out, {"steps": 3}))
    trainer.train()
    assert [r["step"] for r in _metrics(out)] == [0, 1, 2, 3]


# --- the retired log.tensorboard switch -------------------------------------------------------


def test_the_retired_tensorboard_switch_still_loads_and_warns() -> None:
    with pytest.warns(FutureWarning, match="log.tensorboard is deprecated"):
        assert load_config(None, ["log.tensorboard=false"]).log.report_to == ["none"]
    with pytest.warns(FutureWarning):
        config = config_from_dict({"log": {"tensorboard": True}},
                                  load_config(None, ["log.report_to=wandb"]))
    assert config.log.report_to == ["tensorboard", "wandb"]
    with pytest.warns(FutureWarning):
        config = config_from_dict({"log.tensorboard": False},
                                  load_config(None, ["log.report_to=[wandb,tensorboard]"]))
    assert config.log.report_to == ["wandb"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        # both set in one config: they must agree
        assert load_config(None, ["log.tensorboard=true", "log.report_to=[tensorboard,wandb]"]
                           ).log.report_to == ["tensorboard", "wandb"]
        with pytest.raises(ValueError, match=r"^log\.tensorboard=false contradicts "
                                             r"log\.report_to=\['tensorboard'\]"):
            config_from_dict({"log": {"tensorboard": False, "report_to": "tensorboard"}})


def test_a_run_written_with_log_tensorboard_resumes(tmp_path) -> None:
    out = tmp_path / "run"
    _train(out, "log.report_to=none")
    saved = yaml.safe_load((out / "config.yaml").read_text())
    log = saved["log"]
    del log["report_to"], log["project"]
    log["tensorboard"] = False  # config.yaml as a run made before log.report_to wrote it
    (out / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    # the run recorded the retired key, the user did not write it: read without the warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config = resume_config(out, {"steps": 3})
        trainer = tiny_trainer(out, config=config)
        assert config_differences(saved, config_to_dict(config)) == []
    assert config.log.report_to == ["none"]
    trainer.train()
    assert [r["step"] for r in _metrics(out)] == [0, 1, 2, 3]
    assert not (out / "tensorboard").exists()
