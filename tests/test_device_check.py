"""The lent GPU machine's check (scripts/device_wheels.py, scripts/device_check.py lent): the
wheel walk's rules, the size refusal, the train verdict and the MFU arithmetic. The whole path
runs in scripts/test.sh as `scripts/device_check.sh --rehearse --quick`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


device_wheels = _load("device_wheels")
device_check = _load("device_check")


def test_markers_follow_the_target_python_and_requested_extras() -> None:
    env = device_wheels.marker_env("3.12")
    assert device_wheels.applies(Requirement('tomli; python_version < "3.11"'),
                                 device_wheels.marker_env("3.10"), ())
    assert not device_wheels.applies(Requirement('tomli; python_version < "3.11"'), env, ())
    extra = Requirement('antlr4-python3-runtime==4.13.2; extra == "antlr4_13_2"')
    assert not device_wheels.applies(extra, env, ())
    assert device_wheels.applies(extra, env, ("antlr4_13_2",))


def test_machine_packages_are_not_carried_and_the_rehearsal_pins_the_machines_versions(
        tmp_path: Path) -> None:
    # every requirement here is on the lent machine: nothing is downloaded
    manifest = device_wheels.collect(tmp_path, "3.12",
                                     ["transformers>=5.5.3,<5.11", "torch>=2.4", "Numba>=0.60",
                                      'tomli; python_version < "3.11"', "gguf>=0.10"])
    assert manifest["wheels"] == []
    assert set(manifest["machine_requirements"]) == {"transformers", "torch", "numba"}
    lines = device_wheels.rehearsal_requirements(manifest)
    # the machine's transformers (outside gear-rl's own range: what the check runs against),
    # torch's CPU stand-in, numba at gear-rl's floor, packaging for the wheel script
    assert lines == ["numba>=0.60", "packaging", "torch==2.13.0", "transformers==5.17.0"]


def test_the_size_report_refuses_over_the_limit(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    (tmp_path / "a.whl").write_bytes(b"x" * 2**20)
    assert device_wheels.size_report(tmp_path, limit_mib=10_000)
    assert "wheels 1.0 MiB" in capsys.readouterr().out
    assert not device_wheels.size_report(tmp_path, limit_mib=1)
    assert "too large to travel" in capsys.readouterr().err
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_wheels.py"),
                           "--size-only", "--dest", str(tmp_path), "--limit-mib", "1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "too large to travel" in done.stderr


def _run_dir(tmp_path: Path, records: list[dict], device: str = "cuda:0") -> Path:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "run.json").write_text(json.dumps({"device": device, "autocast_bf16": True}))
    return tmp_path


def _step(step: int, **extra: float) -> dict:
    return {"step": step, **{f"time/{p}": 0.5 for p in device_check.PHASES}, **extra}


def test_train_verdict_wants_every_step_every_phase_finite_numbers(tmp_path: Path) -> None:
    good = _run_dir(tmp_path, [_step(1), _step(2)])
    ok, detail, records = device_check.train_verdict(good, 2, expect_device="cuda",
                                                     expect_bf16=True)
    assert ok and len(records) == 2 and "last step rollout 0.50" in detail
    untimed = _step(2)
    del untimed["time/credit"]
    ok, detail, _ = device_check.train_verdict(_run_dir(tmp_path, [_step(1), untimed]), 2)
    assert not ok and "phases not timed: step 2: time/credit" in detail
    ok, detail, _ = device_check.train_verdict(
        _run_dir(tmp_path, [_step(1), _step(2, loss=float("nan"))]), 2)
    assert not ok and "non-finite metrics: step 2: loss" in detail
    ok, detail, _ = device_check.train_verdict(_run_dir(tmp_path, [_step(1)], "cpu"), 1,
                                               expect_device="cuda")
    assert not ok and "expected cuda" in detail


def test_model_flops_count_6n_per_token_and_causal_attention() -> None:
    # N = 100, 2 layers of width 8; rows of 3 and 4 tokens
    assert device_check._flops_per_step(100, 2, 8, [3, 4]) == 6 * 100 * 7 + 6 * 2 * 8 * (9 + 16)


def test_smollm2_shaped_model_has_smollm2s_parameter_count() -> None:
    from gear_rl.models import SMOLLM2_135M_SHAPE, tiny_random_model

    model = tiny_random_model("llama", **{**SMOLLM2_135M_SHAPE, "num_layers": 1})
    # one layer: embedding (tied LM head) + attention + MLP + 2 norms, + the final norm
    d, f, v = 576, 1536, 49_152
    layer = d * d * 2 + 2 * d * 192 + 3 * d * f + 2 * d
    assert sum(p.numel() for p in model.parameters()) == v * d + layer + d
    assert device_check._matmul_params(model) == v * d + layer + d
    # 30 layers: SmolLM2-135M's 134.5M
    assert round((v * d + 30 * layer + d) / 1e6, 1) == 134.5
