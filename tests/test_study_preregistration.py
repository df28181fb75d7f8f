"""A study's rule is fixed before its results (issue 56): ``gear-rl study`` records what its
cells are trained and judged under (``OUT/registration.json``) before the first cell trains;
after a cell finished, a change of the metric, the baseline, the statistics, the seeds or any
other registered field is refused unless recorded as an amendment (``amend=``), and a cell is
never judged as trained under a config it did not train under, with ``train=true`` or
``train=false``. A folder from before registrations is adopted, and says so.

One real study (the tiny random model, one finished cell of two) is trained once per module
(slow: a minute or two); every test works on its own copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gear_rl.cli import main
from gear_rl.study import analyze_study, parse_spec, run_study
from gear_rl.study.registration import REGISTRATION, register, registered_fields
from gear_rl.study.runner import register_study

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = {
    "model": "tiny-random", "task": "arithmetic", "train_size": 32, "steps": 2,
    "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 8},
    "eval": {"size": 4, "k": 2, "max_new_tokens": 4},
    "log": {"report_to": "none", "samples_per_step": 2},
    "optim.lr": 1e-3,
}
STUDY = {"name": "prereg", "seeds": [0], "budget": BUDGET, "tasks": {"arith": {}},
         "methods": {"grpo": {}, "gear": {}}, "metric": "mean@k", "baseline": "grpo"}


def _study(**changes) -> dict:
    data = json.loads(json.dumps(STUDY))
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study folder whose grpo cell finished (trained for real, through the command);
    gear's cell waits."""
    folder = tmp_path_factory.mktemp("trained")
    spec = folder / "study.yaml"
    spec.write_text(yaml.safe_dump(STUDY))
    registration = folder / "out" / REGISTRATION
    assert main(["study", str(spec), f"out={folder / 'out'}", "methods=grpo", "jobs=1",
                 "threads=1", "progress=false"]) == 0
    assert registration.is_file()
    return folder


@pytest.fixture
def study(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """``(spec file, study folder)``: a copy of the trained study."""
    shutil.copytree(trained, tmp_path / "s")
    return tmp_path / "s" / "study.yaml", tmp_path / "s" / "out"


def _run(spec: Path, out: Path, *args: str) -> int:
    return main(["study", str(spec), f"out={out}", "methods=grpo", "jobs=1", "threads=1",
                 "progress=false", *args])


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes()
            for name in ("spec.yaml", "study.md", "study.json", REGISTRATION)}


@pytest.mark.slow
def test_the_first_run_registers_before_any_cell_finished(study: tuple[Path, Path]) -> None:
    _, out = study
    record = json.loads((out / REGISTRATION).read_text())
    assert record["adopted"] is False and record["amendments"] == []
    assert record["cells"] == {"arith/grpo-s0": record["fingerprint"]}  # gear's has not run
    assert record["fields"]["metric"] == "mean@k" and record["fields"]["budget.steps"] == 2
    assert "budget.log.samples_per_step" not in record["fields"]  # changes no result
    text = (out / "study.md").read_text()
    assert "recorded on " in text and "before any cell finished. Not amended since." in text
    assert json.loads((out / "study.json").read_text())["registration"] == record


@pytest.mark.slow
@pytest.mark.parametrize("train", ["true", "false"])
def test_a_rule_changed_after_results_is_refused(study: tuple[Path, Path], train: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's example: metric and baseline edited after the cells finished; rerun with
    train=true or false, nothing is rewritten and the message names both changes."""
    spec, out = study
    before = _files(out)
    spec.write_text(yaml.safe_dump(_study(metric="pass@k", baseline="gear")))
    assert _run(spec, out, f"train={train}") == 2
    err = capsys.readouterr().err
    assert "the study file changed since 1 cell(s)" in err
    assert "baseline: 'grpo' -> 'gear'; metric: 'mean@k' -> 'pass@k'" in err
    assert 'amend="why"' in err
    assert _files(out) == before
    with pytest.raises(ValueError, match=r"metric: 'mean@k' -> 'pass@k'"):
        analyze_study(parse_spec(_study(metric="pass@k", baseline="gear")), out)


@pytest.mark.slow
@pytest.mark.parametrize(("changes", "field"), [
    ({"statistics": {"confidence": 0.9}}, "statistics.confidence: 0.95 -> 0.9"),
    ({"statistics": {"bootstrap_seed": 3}}, "statistics.bootstrap_seed: 0 -> 3"),
    ({"contrasts": [["gear", "grpo"]]}, "contrasts: [] -> [['gear', 'grpo']]"),
    ({"analysis": {"threshold": 0.3}}, "analysis.threshold: 0.1 -> 0.3"),
    ({"methods": {"grpo": {}, "gear": {"seeds": [0, 1]}}}, "methods.gear.seeds: [0] -> [0, 1]"),
    ({"methods": {"grpo": {}}}, "methods.gear.estimator: 'gear' -> not set"),
    ({"methods": {"grpo": {}, "gear": {"overrides": {"credit.lambda_kl": 0.2}}}},
     "methods.gear.overrides.credit.lambda_kl: not set -> 0.2"),
])
def test_every_registered_field_is_held(study: tuple[Path, Path], changes: dict, field: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Judged-under fields, the design (seeds, methods) and an unfinished method's settings:
    each is refused once a cell finished."""
    spec, out = study
    spec.write_text(yaml.safe_dump(_study(**changes)))
    assert _run(spec, out, "train=false") == 2
    assert field in capsys.readouterr().err


@pytest.mark.slow
def test_what_changes_no_result_is_not_registered(study: tuple[Path, Path]) -> None:
    """Labels, the description, keep_checkpoints and the budget's log settings change no
    result: they may change."""
    spec, out = study
    budget = {**BUDGET, "log": {"report_to": "none", "samples_per_step": 4}}
    spec.write_text(yaml.safe_dump(_study(
        description="now described", budget=budget, keep_checkpoints=True,
        methods={"grpo": {"label": "GRPO"}, "gear": {"label": "GEAR"}})))
    assert _run(spec, out, "train=false") == 0
    assert json.loads((out / REGISTRATION).read_text())["amendments"] == []


@pytest.mark.slow
def test_a_recorded_amendment_is_accepted_and_printed(study: tuple[Path, Path],
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    spec, out = study
    changed = _study(metric="pass@k", baseline="gear")
    spec.write_text(yaml.safe_dump(changed))
    assert _run(spec, out, "train=true", "amend=pass@k is what the paper reports") == 0
    assert "amendment 1 recorded (1 cell(s) finished)" in capsys.readouterr().err
    record = json.loads((out / REGISTRATION).read_text())
    (amendment,) = record["amendments"]
    assert amendment["reason"] == "pass@k is what the paper reports"
    assert amendment["cells_finished"] == 1 and amendment["date"]
    assert amendment["changes"] == {"baseline": {"old": "grpo", "new": "gear"},
                                    "metric": {"old": "mean@k", "new": "pass@k"}}
    assert record["fields"] == registered_fields(parse_spec(changed))
    assert (out / "spec.yaml").read_text() == spec.read_text()
    text = (out / "study.md").read_text()
    assert "Amended 1 time(s) since:" in text
    assert ("after 1 cell(s) finished: pass@k is what the paper reports (baseline: 'grpo' -> "
            "'gear'; metric: 'mean@k' -> 'pass@k')") in text
    assert "Metric: held-out pass@k" in text
    # the amended file is now the registration: the same command runs without amend=, and an
    # amendment of nothing is refused
    assert _run(spec, out, "train=false") == 0
    assert _run(spec, out, "train=false", "amend=again") == 2
    assert "nothing to amend" in capsys.readouterr().err
    assert _run(spec, out, "train=false", "amend= ") == 2
    assert "amend= must give the reason" in capsys.readouterr().err
    assert len(json.loads((out / REGISTRATION).read_text())["amendments"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("train", ["true", "false"])
def test_a_finished_cell_is_never_judged_under_another_budget(
        study: tuple[Path, Path], train: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's second example: steps 2 -> 3 with train=false reported the 2-step cell as
    the 3-step study's. Refused, naming the cell and the setting, amendment or not."""
    spec, out = study
    before = _files(out)
    spec.write_text(yaml.safe_dump(_study(budget={**BUDGET, "steps": 3})))
    for extra in ((), ("amend=three steps",)):
        assert _run(spec, out, f"train={train}", *extra) == 2
        err = capsys.readouterr().err
        assert "cell arith/grpo-s0: " in err and "differs in ['steps']" in err
        assert "cannot be amended" in err
    assert _files(out) == before


@pytest.mark.slow
def test_a_folder_from_before_registrations_is_adopted(study: tuple[Path, Path],
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Committed study folders have no registration: the first run adopts the study file
    as it is, says so on stderr and in study.md, and holds it from then on."""
    spec, out = study
    (out / REGISTRATION).unlink()
    assert _run(spec, out, "train=false") == 0
    assert "holds 1 finished cell(s) and no registration" in capsys.readouterr().err
    record = json.loads((out / REGISTRATION).read_text())
    assert record["adopted"] is True and list(record["cells"]) == ["arith/grpo-s0"]
    assert "adopted on " in (out / "study.md").read_text()
    spec.write_text(yaml.safe_dump(_study(metric="pass@k")))
    assert _run(spec, out, "train=false") == 2
    assert "metric: 'mean@k' -> 'pass@k'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cell_finished_but_not_yet_recorded_still_holds_the_rule(
        study: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A study killed after a cell finished and before the registration listed it: the
    finished cell is seen in its folder, and the rule holds."""
    spec, out = study
    record = json.loads((out / REGISTRATION).read_text())
    record["cells"] = {}
    (out / REGISTRATION).write_text(json.dumps(record))
    spec.write_text(yaml.safe_dump(_study(metric="pass@k")))
    assert _run(spec, out, "train=false") == 2
    assert "metric: 'mean@k' -> 'pass@k'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="metric"):
        analyze_study(parse_spec(_study(metric="pass@k")), out)


def test_before_any_result_the_registration_follows_the_file(tmp_path: Path) -> None:
    """Nothing judged yet, nothing to amend: the registration is rewritten from the file."""
    register_study(parse_spec(_study()), tmp_path)
    register_study(parse_spec(_study(metric="pass@k")), tmp_path)
    record = json.loads((tmp_path / REGISTRATION).read_text())
    assert record["fields"]["metric"] == "pass@k" and record["amendments"] == []
    with pytest.raises(ValueError, match="nothing to amend"):
        register(parse_spec(_study()), tmp_path / "fresh", [], amend="why")


@pytest.mark.slow
def test_a_damaged_registration_is_named(study: tuple[Path, Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec, out = study
    (out / REGISTRATION).write_text("{not json")
    assert _run(spec, out, "train=false") == 2
    assert f"{out / REGISTRATION} is damaged" in capsys.readouterr().err
    (out / REGISTRATION).write_text("[]")
    with pytest.raises(ValueError, match="is not a study registration"):
        run_study(parse_spec(_study()), out, jobs=1, threads=1, progress=False,
                  methods=["grpo"])
