"""A default that changes keeps every recorded run's meaning (``CHANGED_CREDIT_DEFAULTS``):
GEAR's ``mean_preserving`` became the default (issue 39) after runs had recorded
``credit: {}``. A run recorded since writes the field out; a run recorded before reads as the
old value when it is resumed, matched by a study or labelled by ``gear-rl compare``. The resume
is a real one (a tiny model trained, then resumed from its checkpoint), and must log exactly
the metrics of the same run recorded with the value written out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import TINY_RUN, tiny_trainer
from gear_rl.credit.registry import upgrade_recorded_config
from gear_rl.rundir import RunDir, write_manifest
from gear_rl.train.config import config_from_dict, config_to_dict, load_config
from gear_rl.train.records import is_measurement
from gear_rl.train.resume import resume_config

pytestmark = pytest.mark.usefixtures("one_thread")
FP32 = ("precision=fp32", "rollout.dtype=fp32", "seed=0", "log.checkpoint_every=2")


def test_records_write_the_field_and_old_records_read_the_old_value() -> None:
    gear = config_to_dict(load_config(None, ["model=tiny-random"]))
    assert gear["credit"] == {"mean_preserving": True}
    paper = config_to_dict(load_config(None, ["model=tiny-random", "credit.preset=paper"]))
    assert paper["credit"] == {"preset": "paper", "mean_preserving": False}
    grpo = config_to_dict(load_config(None, ["model=tiny-random", "estimator=grpo"]))
    assert grpo["credit"] == {}  # not a field of GRPO's config: nothing written, nothing read
    assert upgrade_recorded_config(grpo) == grpo
    old = {**gear, "credit": {"lambda_kl": 0.2}}  # as a run recorded it before issue 39
    assert upgrade_recorded_config(old)["credit"] == {"lambda_kl": 0.2, "mean_preserving": False}
    assert config_from_dict(upgrade_recorded_config(old)).credit_config().mean_preserving is False
    for recorded in (gear, paper):  # a record written since is read as it is
        assert upgrade_recorded_config(recorded) == recorded


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not is_measurement(k)}
            for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _forget_mean_preserving(run: Path) -> None:
    """Rewrite ``run``'s config.yaml and its checkpoints' configs as a run recorded before
    issue 39 wrote them: ``credit`` without ``mean_preserving``."""
    def strip(data: dict) -> dict:
        return {**data, "credit": {k: v for k, v in data["credit"].items()
                                   if k != "mean_preserving"}}

    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump(strip(config), sort_keys=False))
    for state in (run / "checkpoints").glob("step-*/state.json"):
        data = json.loads(state.read_text())
        data["config"] = strip(data["config"])
        state.write_text(json.dumps(data))
        write_manifest(state.parent)  # intact, as that run would have saved it


def test_a_run_recorded_before_the_change_resumes_as_it_trained(tmp_path: Path) -> None:
    runs = {}
    for name, value in (("paper", "false"), ("old", "false"), ("new", "true")):
        runs[name] = tmp_path / name
        config = load_config(None, [*TINY_RUN, *FP32, f"credit.mean_preserving={value}",
                                    f"out={runs[name]}"])
        tiny_trainer(runs[name], config=config).train()
    _forget_mean_preserving(runs["old"])
    recorded = RunDir(runs["old"]).read_config()
    assert recorded["credit"] == {} and upgrade_recorded_config(recorded)["credit"] == {
        "mean_preserving": False}
    for run in runs.values():
        tiny_trainer(run, config=resume_config(run, {"steps": 4})).train()
    # the old record resumed with the value it trained with, step for step ...
    assert [r["step"] for r in _metrics(runs["old"])] == [1, 2, 3, 4]
    assert _metrics(runs["old"]) == _metrics(runs["paper"])
    # ... which the test can tell from today's default: the same run with it differs
    assert _metrics(runs["new"])[2:] != _metrics(runs["paper"])[2:]
    # and its config.yaml, rewritten with the new step count, now says the value
    saved = yaml.safe_load((runs["old"] / "config.yaml").read_text())
    assert saved["credit"] == {"mean_preserving": False} and saved["steps"] == 4
