"""Export and eval edges (issue 56): every command that writes an output folder checks it with
one check (``gear_rl.dataclass_config.check_output_folder``: a file or a dangling link there, a
read-only file system); an export never lands where a resume takes it for a checkpoint, and
pruning never deletes a real checkpoint for a foreign folder; damaged checkpoints, a tokenizer
larger than its model's embedding, a boolean knob given ``maybe``, a path holding ``=`` and an
empty data file each get a clear message naming the user's key; the sandbox labels a memory
error by any name ``memory``. Real CLI calls on a real tiny run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import tiny_trainer
from gear_rl.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
STUDY = Path(__file__).resolve().parents[1] / "studies" / "default.yaml"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A 1-step tiny-random run with its checkpoint."""
    run = tmp_path_factory.mktemp("hostile-export") / "run"
    tiny_trainer(run, "steps=1", "log.checkpoint_every=1").train()
    return run


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder on a real read-only file system (a read-only tmpfs mount; root writes through
    permissions, so a chmod would prove nothing), or one marked immutable (``chattr +i``)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    if not mounted and (shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(folder)], capture_output=True).returncode != 0):
        pytest.skip("neither a read-only mount nor chattr +i is allowed here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)] if mounted else ["chattr", "-i", str(folder)],
                       capture_output=True)


def test_every_command_refuses_an_output_folder_on_a_read_only_file_system(
        tiny_run: Path, read_only: Path, capsys) -> None:
    for argv in (["export", str(tiny_run), str(read_only / "model")],
                 ["export", str(tiny_run), str(read_only)],
                 ["report", str(tiny_run), "--out", str(read_only / "report")],
                 ["compare", str(tiny_run), "--out", str(read_only / "cmp")],
                 ["train", "model=tiny-random", f"out={read_only / 'run'}"],
                 ["credit-check", "model=tiny-random", f"out={read_only / 'cc'}"],
                 ["study", str(STUDY), f"out={read_only / 'study'}"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "cannot be written" in err and str(read_only) in err, (argv, err)
        assert "Traceback" not in err
    assert not list(read_only.iterdir())


def test_export_through_links_and_to_the_current_folder(tiny_run: Path, tmp_path: Path,
                                                        monkeypatch, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    link = tmp_path / "link"
    link.symlink_to(empty)
    assert main(["export", str(tiny_run), str(link)]) == 0  # into the folder the link names
    capsys.readouterr()
    assert link.is_symlink() and (empty / "model.safetensors").is_file()

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert main(["export", str(tiny_run), str(dangling)]) == 2
    assert "a dangling link" in capsys.readouterr().err
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", str(here), str(here / "sub" / "..")):
        assert main(["export", str(tiny_run), out]) == 2, out
        err = capsys.readouterr().err
        assert "current" in err and "give the path of a new folder" in err, err
    assert here.is_dir() and not list(here.iterdir())

    named = tmp_path / "lr=3e-5" / "a=b"  # a path holding "=" is a path, not a key
    assert main(["export", str(tiny_run), str(named)]) == 0
    capsys.readouterr()
    assert (named / "config.json").is_file()


def test_an_export_into_a_runs_checkpoints_is_refused_and_pruning_spares_real_ones(
        tiny_run: Path, tmp_path: Path, capsys) -> None:
    target = tiny_run / "checkpoints" / "step-000099"
    assert main(["export", str(tiny_run), str(target)]) == 2
    assert "inside the checkpoints folder of the run" in capsys.readouterr().err
    assert not target.exists()

    # a foreign step folder (copied in by hand) is never counted, nor pruned, as a checkpoint
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    foreign = run / "checkpoints" / "step-000099"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    tiny_trainer(run, config=_resume(run, "steps=2", "log.keep_checkpoints=2")).train()
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest", "step-000001", "step-000002", "step-000099"], names
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000002"


def _resume(run: Path, *overrides: str):
    from gear_rl.dataclass_config import parse_overrides
    from gear_rl.train.resume import resume_config

    return resume_config(str(run), parse_overrides(list(overrides)))


def test_a_run_whose_only_checkpoint_is_damaged_says_so(tiny_run: Path, tmp_path: Path,
                                                        capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    weights = run / "checkpoints" / "step-000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    for argv in (["export", str(run), str(tmp_path / "out")],
                 ["eval", str(run), "eval.size=2"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "no intact checkpoint" in err and "step-000001" in err, err
        assert "model.safetensors has 1000 bytes" in err, err
        assert "neither a checkpoint folder" not in err


def test_eval_refuses_a_model_whose_tokenizer_outgrows_its_embedding(tmp_path: Path,
                                                                      capsys) -> None:
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model

    model_dir = tmp_path / "small-vocab"
    tokenizer = build_tiny_tokenizer()
    tiny_random_model("llama", vocab_size=len(tokenizer) - 9).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    assert main(["eval", f"model={model_dir}", "eval.size=2", "eval.k=1"]) == 2
    err = capsys.readouterr().err
    assert f"its tokenizer has {len(tokenizer)} tokens and its input embedding " in err, err
    assert "IndexError" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["eval", "model=tiny-random", "records=maybe"],
    ["eval", "model=tiny-random", "eval.records=maybe"],
    ["train", "model=tiny-random", "eval.at_start=maybe"],
    ["credit-check", "model=tiny-random", "mixed_only=maybe"],
    ["study", str(STUDY), "train=maybe"],
])
def test_every_boolean_knob_refuses_maybe(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'maybe'" in err and ("bool" in err or "true or false" in err), err


def test_an_empty_data_file_is_named_by_the_users_key(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "reward_model": {"ground_truth": str(2 * i)}}) + "\n" for i in range(6)))
    for overrides, key, path in ((["task=" + str(empty)], "task", empty),
                                 (["task=" + str(empty), f"eval_data={data}"], "task", empty),
                                 ([f"task={data}", f"eval_data={empty}"], "eval_data", empty)):
        assert main(["train", "model=tiny-random", *overrides,
                     f"out={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert f"{key} '{path}': the file holds no problems" in err, err
        assert "train_path" not in err and "eval_path" not in err


def test_the_sandbox_labels_a_memory_error_by_any_name_memory() -> None:
    from gear_rl.agent.tools import PythonSandbox

    with PythonSandbox(workers=1, timeout_s=10.0, memory_mb=256) as sandbox:
        numpy = sandbox.run("import numpy as np\nx = np.ones(1 << 31)\n")
        assert "Unable to allocate" in numpy.stderr, numpy
        assert (numpy.exit_code, numpy.limit_hit) == (1, "memory"), numpy
        torch_like = sandbox.run(  # torch's CPU allocator's words
            "raise RuntimeError('DefaultCPUAllocator: can\\'t allocate memory: you tried to "
            "allocate 17179869184 bytes. Error code 12 (Cannot allocate memory)')")
        assert torch_like.limit_hit == "memory", torch_like
        other = sandbox.run("raise RuntimeError('something else')")
        assert other.limit_hit is None, other


def test_cli_subprocess_export_to_a_dangling_link_is_one_line(tiny_run: Path,
                                                              tmp_path: Path) -> None:
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    result = subprocess.run(
        [sys.executable, "-m", "gear_rl.cli", "export", str(tiny_run), str(dangling)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "dangling link" in result.stderr, result.stderr


def test_a_run_folder_holding_an_equals_sign_is_a_path_to_every_command(
        tiny_run: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "lr=3e-5"
    shutil.copytree(tiny_run, run)
    assert main(["compare", str(run), "--out", str(tmp_path / "cmp")]) == 0
    assert main(["eval", str(run), "eval.size=2", "eval.max_new_tokens=2"]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert main(["study", str(tmp_path / "a=b.yaml")]) == 2
    assert "study spec" in capsys.readouterr().err  # read as the spec path (missing here)
