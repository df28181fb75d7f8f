"""A real verl 0.9.1 job on this machine's CPU: ``scripts/verl_cpu.sh [hydra overrides...]``.

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853; the job is the recipe in
``recipes/verl/`` (``run_gear_qwen3_4b.sh`` with ``gear_qwen3_4b.yaml``), run as is through
``python -m verl.trainer.main_ppo``: a one-node Ray cluster, verl's v1 trainer, FSDP2 actor
workers on gloo, a vLLM-CPU rollout server with verl's per-step weight sync, TransferQueue. What
this module adds is only what a CPU needs and what the recipe leaves to the user:

- the CPU platform and the vLLM-CPU weight fix (``gear_rl.integrations.verl.cpu``,
  ``gear_rl.integrations.vllm_cpu``), switched on by :data:`~gear_rl.integrations.verl.cpu.CPU_ENV`
  and :func:`~gear_rl.integrations.verl.cpu.cpu_overrides`;
- a tiny random Qwen2 (:func:`write_tiny_model`) unless ``actor_rollout_ref.model.path`` is
  given (``smollm2`` names the bundled SmolLM2-135M-Instruct), and a small data set for the
  setting (:func:`write_default_data`) unless ``data.train_files`` is given;
- small-batch defaults (:func:`small_overrides`); every override the user passes comes last
  and wins;
- clean-up: the job runs in its own session; when it ends, however it ends (exit, error,
  Ctrl-C), what is left of its process group is killed and the shared-memory segments it
  created in ``/dev/shm`` (vLLM's ``psm_*``, verl's ``verl_weights_*``, ``sem.mp-*``) are
  removed.

Settings (``SETTING=math|products|tir|toolrl|sokoban|keydoor|textarena:GAME``, as the recipe's
script): ``math`` single-turn math, ``products`` gear-rl train's default task as the trainer
shows it (its prompts, problems and first 64 held-out ones; for comparing the two engines),
``tir`` math with the Python tool (verl's ``tool_agent`` loop, gear-rl's sandbox as the tool),
``toolrl`` function calling with the ToolRL reward. ``GEAR_RL_VERL_PRECISION`` is ``fp32`` (the
default) or ``bf16`` (verl's own default: fast only with AVX-512 BF16 / AMX).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gear_rl.dataclass_config import hydra_override_key
from gear_rl.integrations.verl.cpu import CPU_ENV, cpu_overrides
from gear_rl.stop import StopSignal, exit_code, stop_signals

SETTINGS = ("math", "tir", "toolrl", "products")
SHM = Path("/dev/shm")
SHM_PATTERNS = ("psm_", "verl_weights_", "sem.mp-")
RECIPE = Path(__file__).resolve().parents[4] / "recipes" / "verl" / "run_gear_qwen3_4b.sh"
# vLLM-CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB); unset it takes a share of the
# machine's memory per replica (vllm/platforms/cpu.py), which two replicas exceed on 24 GB.
DEFAULT_KV_CACHE_GIB = "1"
SMOLLM2 = "smollm2"

# vLLM-CPU 0.27.1 has no attention kernel for head_dim 16: tiny test models use head_dim 64.
TINY_MODEL: dict[str, Any] = dict(arch="qwen2", hidden_size=128, num_heads=2, num_kv_heads=2,
                                  intermediate_size=256, num_layers=2,
                                  max_position_embeddings=2048)


def _given(overrides: Sequence[str], key: str) -> str | None:
    """The value the user gave ``key`` (the last one), or ``None``."""
    value = None
    for override in overrides:
        if hydra_override_key(override) == key and "=" in override:
            value = override.split("=", 1)[1]
    return value


TOOL_CALL = ('<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n'
             '</tool_call>')
"""What the ``tir`` tiny model is taught to write at every turn (verl's hermes tool format)."""


def write_tiny_model(path: Path, *, tool_call: str | None = None,
                     actions: Sequence[str] = (), prompts: Sequence[list[dict[str, str]]] = (),
                     steps: int = 150) -> Path:
    """A randomly initialised Qwen2 (:data:`TINY_MODEL`, seed 0) and gear-rl's byte-level ChatML
    tokenizer, saved as a Hugging Face directory; reused when already there.

    With ``tool_call``, the model is first fitted (``steps`` Adam steps, seed 0, about 10 s) to
    write exactly that text and end its turn after each of ``prompts`` (chat messages: the
    data set's own, so positions and wording are those the run will see), in first turns and
    after a tool's answer alike: a random model never writes a well-formed call, and the ``tir``
    smoke run must make real sandbox calls through verl's tool agent loop. With ``actions``
    instead, it is fitted to answer each turn with one of them drawn at random (a board comes
    back as a user turn): an environment's random walker, whose episodes differ in return, so
    the step-level estimators have something to credit.
    """
    from gear_rl.models.tiny import build_tiny_tokenizer, tiny_random_model

    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tokenizer = build_tiny_tokenizer()
    model = tiny_random_model(**TINY_MODEL)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if tool_call is not None and actions:
        raise ValueError("teach a tool call or actions, not both")
    texts = [tool_call] if tool_call is not None else list(actions)
    if texts:
        if not prompts:
            raise ValueError("teaching a turn needs the prompts it will follow")
        _teach(model, tokenizer, texts, prompts, steps=steps,
               answer_role="tool" if tool_call is not None else "user")
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, path)
    return path


def _teach(model: Any, tokenizer: Any, texts: Sequence[str],
           prompts: Sequence[list[dict[str, str]]], *, steps: int, batch: int = 4,
           answer_role: str = "tool") -> None:
    """Fit ``model`` to answer every assistant turn after ``prompts`` with one of ``texts``
    (drawn at random; loss on its tokens only), in first turns and after an ``answer_role``
    turn (a tool's output, or the environment's board as a user turn)."""
    import random

    import torch

    rng = random.Random(0)
    targets = [tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
               for text in texts]

    def pick(options: Sequence[Any]) -> Any:
        # one option draws nothing: the tool-call model is the one taught before actions were
        return options[0] if len(options) == 1 else rng.choice(options)

    def context() -> list[int]:
        messages = list(rng.choice(prompts))
        if rng.random() < 0.5:  # a later turn, after the tool's answer or the next board
            messages += [{"role": "assistant", "content": pick(texts)},
                         {"role": answer_role, "content": (str(rng.randint(0, 99))
                                                           if answer_role == "tool"
                                                           else messages[-1]["content"])}]
        return tokenizer.apply_chat_template(messages, tokenize=True,
                                             add_generation_prompt=True)["input_ids"]

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            pairs = [(context(), pick(targets)) for _ in range(batch)]
            rows = [c + t for c, t in pairs]
            width = max(len(r) for r in rows)
            ids = torch.full((batch, width), tokenizer.pad_token_id)
            labels = torch.full((batch, width), -100)
            for i, (row, (_, target)) in enumerate(zip(rows, pairs, strict=True)):
                ids[i, :len(row)] = torch.tensor(row)
                labels[i, len(row) - len(target):len(row)] = torch.tensor(target)
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()


def _check_setting(setting: str) -> None:
    from gear_rl.integrations.verl.data import ENV_SETTINGS, is_env_setting

    if setting not in SETTINGS and not is_env_setting(setting):
        raise ValueError(f"SETTING must be one of {', '.join((*SETTINGS, *ENV_SETTINGS))}, got "
                         f"{setting!r}")


def write_default_data(setting: str, out: Path, *, train_size: int = 64, eval_size: int = 16,
                       seed: int = 0) -> tuple[Path, Path]:
    """``out/train.parquet`` and ``out/test.parquet`` in verl's layout for ``setting``, from
    gear-rl's own tasks (one-digit products for ``math``; the same with the tool prompt for
    ``tir``; a few generated function-calling rows for ``toolrl``), through the recipe's data
    converter (``gear_rl.integrations.verl.data``)."""
    from gear_rl.integrations.verl import data

    _check_setting(setting)
    train, test = out / "train.parquet", out / "test.parquet"
    if train.exists() and test.exists():
        return train, test
    out.mkdir(parents=True, exist_ok=True)
    if setting == data.PRODUCTS:  # gear-rl train's default task: its problems, 64 held out
        from gear_rl.tasks.base import DEFAULT_TRAIN_SIZE

        train_size, eval_size = DEFAULT_TRAIN_SIZE, 64
    data.write_example_data(setting, out, train_size=train_size, eval_size=eval_size, seed=seed)
    return train, test


def small_overrides(*, n_ranks: int, tiny: bool, setting: str = "math") -> list[str]:
    """The recipe scaled down to a CPU: 4 prompts x 2 samples a step, short responses, 3 steps,
    no validation, no checkpoints, console metrics. A tiny random model gets
    ``digit_share_reward`` (``gear_rl.integrations.verl.rewards``) in ``math`` and ``tir``: it
    never answers right, and a constant reward leaves nothing to update."""
    from gear_rl.integrations.verl.data import is_env_setting

    env = is_env_setting(setting)
    response = 16 if tiny else 64
    prompt = 1024 if setting == "toolrl" else 512  # tools' schemas
    extra = []
    if setting == "tir":
        response = 320 if tiny else 512  # a call, its answer and a second call fit
    elif env:
        # gear-rl train's episode budget (AgentLimits.max_response_tokens); the tiny model's
        # byte-level tokens make a board about 110 tokens and the first one about 470, so it
        # plays 3 turns (the real model its environment's step limit)
        response, prompt = (512, 640) if tiny else (384, 512)
        if tiny:
            extra.append("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3")
    if tiny and setting != "toolrl" and not env:
        extra.append("reward.custom_reward_function.name=digit_share_reward")
    micro = max(1, 8 // n_ranks)
    return [
        *extra,
        "data.train_batch_size=4",
        f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}",
        "actor_rollout_ref.rollout.n=2",
        # the tiny tir model writes its taught 83-token call whole in 0.40 of its samples at
        # T=1, and a job whose 16 samples held none failed the tir smoke test about one run in
        # four; at T=0.5 the call's tokens are sampled near-greedily
        f"actor_rollout_ref.rollout.temperature={0.5 if tiny and setting == 'tir' else 1.0}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "reward.num_workers=1",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
    ]


@dataclass
class JobPlan:
    """What :func:`run_job` runs: the command, its environment and working directory."""

    command: list[str]
    env: dict[str, str]
    workdir: Path
    setting: str
    notes: list[str] = field(default_factory=list)


def plan_job(overrides: Sequence[str], *, setting: str = "math",
             workdir: str | Path = "runs/verl-cpu", python: str | None = None,
             device: str = "cpu") -> JobPlan:
    """Prepare the model and data the overrides do not name and build the recipe command.

    Args:
        overrides: Hydra overrides from the user; they come last, so they win.
        setting: ``math``, ``tir``, ``toolrl`` or an environment (the recipe's ``SETTING``).
        workdir: where the tiny model, the data and verl's checkpoints go.
        python: the interpreter of the verl environment (default: this one).
        device: ``cpu`` (the CPU mode: its platform, precision and small-batch overrides) or
            ``cuda`` (the recipe as is, on the visible GPUs: only the model and data the
            overrides do not name are added).
    """
    _check_setting(setting)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            raise ValueError(f"not a Hydra override (key=value): {override!r}")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    ranks_text = _given(overrides, "trainer.n_gpus_per_node") or "1"
    try:
        n_ranks = int(ranks_text)
    except ValueError:
        raise ValueError(
            f"trainer.n_gpus_per_node must be an integer, got {ranks_text!r}") from None
    model = _given(overrides, "actor_rollout_ref.model.path")
    tiny = model is None
    env = dict(os.environ)
    train_files = _given(overrides, "data.train_files")
    if train_files is None:
        data_dir = workdir / f"data-{setting}"
        write_default_data(setting, data_dir)
        train_files = str(data_dir / "train.parquet")
        notes.append(f"data: {data_dir}/{{train,test}}.parquet")
        # the recipe reads <GEAR_DATA>/<setting>/{train,test}.parquet; GEAR_DATA is workdir
        link = workdir / setting
        if not link.exists():
            link.symlink_to(data_dir.name)
    elif _given(overrides, "data.val_files") is None:
        raise ValueError("data.train_files is given without data.val_files: give both (the "
                         "recipe would look for a held-out file next to gear-rl's own data)")
    from gear_rl.integrations.verl.data import is_env_setting

    if model is None and is_env_setting(setting):
        from gear_rl.tasks.verl_data import load_rows

        prompts = [row["prompt"] for row in load_rows(train_files)]
        model_path = write_tiny_model(workdir / f"tiny-qwen2-walker-{setting.replace(':', '-')}",
                                      actions=("up", "down", "left", "right"), prompts=prompts,
                                      steps=60)
        notes.append(f"model: tiny Qwen2 taught to answer each board with a random move, at "
                     f"{model_path}")
    elif model is None and setting == "tir":
        from gear_rl.tasks.verl_data import load_rows

        prompts = [row["prompt"] for row in load_rows(train_files)]
        model_path = write_tiny_model(workdir / "tiny-qwen2-tool", tool_call=TOOL_CALL,
                                      prompts=prompts)
        notes.append(f"model: tiny Qwen2 taught to call the python tool, at {model_path}")
    elif model is None:
        model_path = write_tiny_model(workdir / "tiny-qwen2")
        notes.append(f"model: tiny random Qwen2 at {model_path}")
    elif model == SMOLLM2:
        from gear_rl.models.smollm2 import ensure_smollm2

        model_path = ensure_smollm2()
        notes.append(f"model: SmolLM2-135M-Instruct (bundled) at {model_path}")
        overrides = [f"actor_rollout_ref.model.path={model_path}"
                     if hydra_override_key(o) == "actor_rollout_ref.model.path" else o
                     for o in overrides]
    else:
        model_path = Path(model)
    if device == "cpu":
        env.update(CPU_ENV)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KV_CACHE_GIB)
        # Ray starts an actor without num_cpus with one OpenMP thread, so each FSDP rank's
        # passes ran on one core; the cores shared out between the ranks instead (unless the
        # user set it): SmolLM2's Sokoban step 370 -> 231 s on 2 cores and 1 rank (docs/verl.md)
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(n_ranks)))
    env.update(SETTING=setting, GEAR_DATA=str(workdir), GEAR_MODEL=str(model_path),
               GPUS_PER_NODE=str(n_ranks), NNODES="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    python = python or sys.executable
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
    precision = os.environ.get("GEAR_RL_VERL_PRECISION", "fp32")
    ours = [*(cpu_overrides(n_ranks=n_ranks, precision=precision)
              + small_overrides(n_ranks=n_ranks, tiny=tiny, setting=setting)
              if device == "cpu" else []),
            f"trainer.default_local_dir={workdir}/checkpoints",
            "trainer.project_name=gear_rl_cpu", f"trainer.experiment_name={setting}"]
    given = {hydra_override_key(o) for o in overrides}
    ours = [o for o in ours if hydra_override_key(o) not in given]
    command = ["bash", str(RECIPE), *ours, *overrides]
    return JobPlan(command=command, env=env, workdir=workdir, setting=setting, notes=notes)


def threads_per_rank(n_ranks: int) -> int:
    """OpenMP threads for each of a CPU job's ``n_ranks`` FSDP ranks: the cores this process
    may use, shared out (at least one each)."""
    from gear_rl.rundir import usable_cores

    return max(1, usable_cores() // max(1, n_ranks))


_STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")


def console_metrics(log: str) -> dict[int, dict[str, float]]:
    """verl's console metrics (``step:N - key:value - ...`` lines) by step; values verl prints
    as ``np.float64(x)`` are read as ``x``; non-numeric ones are left out."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = _STEP_LINE.search(line)
        if match is None:
            continue
        values = steps.setdefault(int(match.group(1)), {})
        for item in match.group(2).split(" - "):
            key, _, value = item.partition(":")
            with contextlib.suppress(ValueError):
                values[key.strip()] = float(re.sub(r"^np\.\w+\((.*)\)$", r"\1", value.strip()))
    return steps


def _shm_entries() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir() if p.name.startswith(SHM_PATTERNS)}
    except OSError:
        return set()


@contextlib.contextmanager
def shm_cleanup() -> Iterator[None]:
    """Remove the ``/dev/shm`` segments (vLLM ``psm_*``, verl ``verl_weights_*``,
    ``sem.mp-*``) that appear while the block runs, however it ends."""
    before = _shm_entries()
    try:
        yield
    finally:
        for name in sorted(_shm_entries() - before):
            with contextlib.suppress(OSError):
                (SHM / name).unlink()


def _kill_group(process: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.2)


def run_job(plan: JobPlan, *, timeout_s: float | None = None,
            log_path: Path | None = None) -> int:
    """Run ``plan`` in its own session, streaming its output (to ``log_path`` as well when
    given); on exit, error, timeout, Ctrl-C or a stop signal (:mod:`gear_rl.stop`) kill what is
    left of it and remove its shared memory. The timeout runs on the clock, not on the job's
    output: a silent job is stopped on time. Returns the job's exit code (124 on timeout, 130
    on Ctrl-C, 128 + the signal's number on a stop signal, :mod:`gear_rl.stop`)."""
    log = log_path.open("w") if log_path is not None else None
    lines: queue.Queue[str | None] = queue.Queue()
    try:
        with shm_cleanup(), stop_signals():
            process = subprocess.Popen(plan.command, env=plan.env, cwd=plan.workdir,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True, text=True, bufsize=1)

            def pump() -> None:
                assert process.stdout is not None
                for line in process.stdout:
                    lines.put(line)
                lines.put(None)

            threading.Thread(target=pump, name="verl-cpu-output", daemon=True).start()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            try:
                while True:
                    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                    try:
                        line = lines.get(timeout=wait)
                    except queue.Empty:
                        print(f"[verl-cpu] timed out after {timeout_s:.0f} s: stopping the job",
                              file=sys.stderr)
                        return 124
                    if line is None:
                        return process.wait()
                    sys.stdout.write(line)
                    if log is not None:
                        log.write(line)
            except KeyboardInterrupt as stop:  # Ctrl-C, or a stop signal (gear_rl.stop)
                how = stop if isinstance(stop, StopSignal) else "interrupted"
                print(f"[verl-cpu] {how}: stopping the job", file=sys.stderr)
                return exit_code(stop)
            finally:
                _kill_group(process)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
    finally:
        if log is not None:
            log.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gear_rl.integrations.verl.cpu_job [--workdir DIR] [overrides...]``."""
    parser = argparse.ArgumentParser(
        prog="scripts/verl_cpu.sh",
        description="Run a real verl 0.9.1 job (Ray, FSDP2 on gloo, vLLM-CPU, TransferQueue) on "
                    "this CPU with gear-rl's recipe (recipes/verl). Arguments are Hydra "
                    "overrides; SETTING=math|products|tir|toolrl|sokoban|keydoor|"
                    "textarena:GAME picks the recipe's setting.")
    parser.add_argument("--workdir", default=os.environ.get("GEAR_RL_VERL_WORKDIR",
                                                            "runs/verl-cpu"),
                        help="tiny model, data and checkpoints (default runs/verl-cpu)")
    parser.add_argument("--log", default=None, help="also write the job's output here")
    parser.add_argument("--timeout", type=float, default=None, help="stop after this many s")
    parser.add_argument("--dry-run", action="store_true",
                        help="prepare model and data, print the command and exit")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unknown option(s) {unknown}; Hydra overrides are key=value")
    try:
        plan = plan_job(overrides, setting=os.environ.get("SETTING", "math"),
                        workdir=args.workdir)
    except ValueError as err:
        print(f"[verl-cpu] {err}", file=sys.stderr)
        return 2
    for note in plan.notes:
        print(f"[verl-cpu] {note}", file=sys.stderr)
    print("[verl-cpu] " + " ".join(plan.command), file=sys.stderr)
    if args.dry_run:
        print(json.dumps({"command": plan.command,
                          "env": {k: plan.env[k] for k in sorted(CPU_ENV)}}, indent=1))
        return 0
    return run_job(plan, timeout_s=args.timeout,
                   log_path=Path(args.log) if args.log else None)


if __name__ == "__main__":
    sys.exit(main())
