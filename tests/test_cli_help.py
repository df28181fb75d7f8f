"""`gear-rl train --help`: every key with its default and meaning, the chosen estimator's credit
keys, and the registered estimators (the real console script, and in-process)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gear_rl.cli import main
from gear_rl.credit import estimator_names, get_estimator
from gear_rl.dataclass_config import field_default, field_docs
from gear_rl.train.config import TrainConfig, valid_keys

GEAR_RL = Path(sys.executable).with_name("gear-rl")


def console(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GEAR_RL), "train", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)


@pytest.mark.skipif(not GEAR_RL.is_file(), reason="the gear-rl console script is not installed")
def test_console_help_lists_every_key_with_its_default() -> None:
    result = console("--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("usage: gear-rl train [CONFIG.yaml] [key=value ...]")
    for key in valid_keys():
        assert f"\n  {key} = " in out, key
    assert "\n  rollout.temperature = 1.0\n      sampling temperature;" in out
    assert "\n  optim.eps = 1e-08\n      AdamW's denominator term" in out
    assert '\n  log.report_to = ["tensorboard"]\n' in out
    assert "\n  rollout.batch_size = null\n" in out
    # the default estimator's credit keys, and every registered estimator with its line
    default = TrainConfig().estimator
    assert f"estimator={default}: {get_estimator(default).description}" in out
    assert "\n  credit.lambda_kl = 0.1\n      onset threshold" in out
    for name in estimator_names():
        assert f"  {name} " in out and get_estimator(name).description in out


@pytest.mark.skipif(not GEAR_RL.is_file(), reason="the gear-rl console script is not installed")
def test_console_help_of_a_chosen_estimator() -> None:
    result = console("estimator=rlsd", "--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    rlsd = get_estimator("rlsd")
    assert f"estimator=rlsd: {rlsd.description} ({rlsd.paper})" in out
    assert "\n  credit.lam = 0.5\n      mixing weight of the teacher-ratio term" in out
    assert "\n  credit.eps_w = 0.2\n      clip half-width of the ratio." in out
    assert "\n  credit.lambda_kl = " not in out  # GEAR's keys are not rlsd's


def test_help_shows_each_estimators_own_fields(capsys) -> None:
    for name in estimator_names():
        assert main(["train", f"estimator={name}", "--help"]) == 0
        out = capsys.readouterr().out
        words = " ".join(out.split())
        estimator = get_estimator(name)
        docs = field_docs(estimator.config_cls)
        for field in dataclasses.fields(estimator.config_cls):
            line = f"\n  credit.{field.name} = "
            if field.name in estimator.fixed:
                assert line not in out and f"credit.{field.name} is pinned" in out, name
            else:
                assert line in out, (name, field.name)
                meaning = " ".join(docs[field.name].replace("``", "").split())
                assert f"credit.{field.name} = " in words and meaning in words, (name, field)
        if estimator.paper:
            assert estimator.paper in out


def test_help_defaults_are_the_config_defaults(capsys) -> None:
    assert main(["train", "-h"]) == 0
    out = capsys.readouterr().out
    signals = {f.name: f for f in dataclasses.fields(TrainConfig().signals)}
    template = field_default(signals["answer_template"])
    assert "=== Reference (for checking only) ===" in template
    assert "\n  signals.answer_template = \"\\n\\n=== Reference" in out


def test_help_reads_the_estimator_from_a_config_file(tmp_path, capsys) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("estimator: top_entropy\n")
    assert main(["train", str(path), "--help"]) == 0
    assert "\n  credit.rho = 0.2\n" in capsys.readouterr().out


def test_help_with_an_unknown_estimator_suggests_the_nearest(capsys) -> None:
    assert main(["train", "estimator=rlds", "--help"]) == 2
    assert "unknown estimator 'rlds'; did you mean 'rlsd'?" in capsys.readouterr().err
    assert main(["train", "rollout.temprature=1", "--help"]) == 2
    assert "did you mean 'rollout.temperature'?" in capsys.readouterr().err
