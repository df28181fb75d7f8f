"""Step time of TRL 1.16's ``GRPOTrainer`` and of this project's TRL ``GEARTrainer`` against
``gear-rl train`` (issue 15), on the same work.

Four configurations, each in its own Python process (so threads, allocator and memory do not
interfere), run one after another, never in parallel:

- ``trl_grpo``: ``trl.GRPOTrainer`` (plain GRPO);
- ``trl_gear``: ``gear_rl.integrations.trl.GEARTrainer`` (TRL with GEAR's per-token advantages);
- ``gearrl_grpo``: ``gear-rl train estimator=grpo``;
- ``gearrl_gear``: ``gear-rl train`` (GEAR, the default estimator).

What is the same in all four:

- model: ``config.model`` (default the bundled SmolLM2-135M-Instruct), loaded for TRL the way
  the trainer loads it (``gear_rl.train.runtime.build_runtime``: fp32 master weights) and passed
  to TRL as the model object;
- data: the task's training problems (default ``products``) in the order the trainer visits
  them (``Trainer._problems_for_step``), as chat prompts rendered by the tokenizer's chat
  template (the TRL worker checks, every step, that the prompt ids TRL sampled from equal
  ``gear_rl.signals.prompt_ids`` of the same problems: ``prompts_match``); reward: the task's
  scorer on the decoded completion; the teacher (GEAR): the problem's reference with the
  library's hint (``TeacherPromptConfig``), exact full-vocabulary reverse KL, GEAR's default
  config;
- batch: ``rollout.prompts_per_step`` (4) prompts x ``rollout.samples_per_prompt`` (8) per step,
  one optimiser step per step, sampled in one generation call. TRL: ``num_generations=8``,
  ``per_device_train_batch_size`` = ``--micro-batch`` (default 32, the whole batch in one
  forward/backward), ``gradient_accumulation_steps`` = batch / micro-batch,
  ``steps_per_generation`` = that (TRL's default, 1 with the whole batch), ``num_iterations=1``;
  gear-rl: ``loss.epochs=1``, ``loss.minibatches=1`` (its defaults);
- tokens: ``rollout.max_new_tokens`` (32) = TRL's ``max_completion_length``; temperature 1.0,
  top-p 1.0, top-k off;
- loss: PPO clip 0.2 / clip-higher 0.28 (gear-rl's defaults = TRL's ``epsilon`` /
  ``epsilon_high``), aggregated over all tokens of the batch (gear-rl ``token-mean`` = TRL
  ``loss_type="dapo"``), no KL term (``beta=0``; gear-rl ``loss.kl_coef=0``);
- optimiser: ``torch.optim.AdamW`` (TRL ``optim="adamw_torch"``), same lr, betas, eps, weight
  decay 0, gradient clipping 1.0, constant learning rate;
- precision (``--precision``): bf16 autocast over fp32 master weights (gear-rl
  ``precision=bf16``, TRL ``bf16=True``) or fp32 for both (gear-rl ``precision=fp32``, TRL
  ``bf16=False``); the default ``auto`` takes bf16 where the processor computes it natively
  (AVX-512 BF16 / AMX, CUDA) and fp32 elsewhere (on an AVX2-only CPU a bf16 matmul is emulated:
  about 70x slower than fp32 on the project's AMD EPYC), the precision ``gear-rl train``
  picks by default;
- threads: ``--threads`` (default 2) through ``torch.set_num_threads`` (gear-rl ``threads=``)
  and ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``; every process gets ``OMP_WAIT_POLICY=PASSIVE``
  (gear-rl's console script sets it for itself; TRL gets it too, so spinning OpenMP threads on a
  shared machine penalise neither) and ``TOKENIZERS_PARALLELISM=false``.

Each engine keeps its own defaults for what the issue does not fix. gear-rl's are part of
what is measured: how it packs the update into micro-batches (``loss.micro_batch_tokens``,
``loss.micro_batch_size``), whether it runs each distinct prompt once with gradients and lets
its responses attend to the cached prefix (``loss.share_prompts``), whether the old log-probs
come from a separate no-grad scoring pass; the table prints the run's ``loss`` section from its
``config.yaml``. Any ``key=value`` given on the command line reaches gear-rl's runs and, where
TRL has the same setting (model, task, rollout, optimiser, clip, credit, signals), TRL's.

Differences in work that remain:

- TRL computes the policy log-probs once, in the loss forward (with ``num_iterations=1`` and
  generation aligned with the optimiser step its old log-probs are the detached current ones;
  TRL skips the separate old-log-prob pass). TRL's ``GEARTrainer`` adds one no-grad student +
  teacher pass over the batch for the divergence and entropy (it cannot reuse log-probs TRL
  does not compute here). gear-rl's scoring pass, where it runs, is its ``time/signals``.
- gear-rl's prompt sharing, where on, runs each prompt once per group of 8 in the update; TRL
  runs ``prompt + completion`` for every row (8 copies of each prompt's forward and backward).
  Fewer FLOPs for the same gradients (up to rounding): an engine's choice, not less work asked.
- ``GEARTrainer``'s signal pass (``gear_rl.signals.token_signals``) calls the model's backbone
  and LM head directly, so accelerate's autocast, which wraps only ``model.forward``, does not
  reach it: as the integration stands it runs that pass in fp32 under ``bf16=True``. By default
  (``--trl-gear-signals autocast``) the benchmark runs it inside TRL's own
  ``accelerator.autocast()``, the precision gear-rl's scoring pass runs in;
  ``--trl-gear-signals as-is`` measures the integration unchanged.
- TRL generates with ``model.generate`` on the fp32 training weights under accelerate's bf16
  autocast (HF's sampling loop, a bf16 cast of every weight at every decoding step, fp32
  logits); gear-rl samples with its own KV-cache loop on a bf16 copy of the weights
  (``rollout.dtype=auto``: bf16 where the processor computes bf16 natively), refreshed after
  every update (the copy is counted in ``time/update``). That is a design difference of the
  engines, not a difference in the amount of work (same batch, same number of new tokens);
  pass ``rollout.dtype=fp32`` to sample from the fp32 weights under gear-rl too.
- TRL's gradient checkpointing (on by default in ``GRPOConfig``) is turned off: gear-rl does
  not checkpoint the backbone, and recomputing the forward would charge TRL for a memory
  setting. Both score the completion tokens through a chunked LM head (TRL's fused head,
  gear-rl's ``gear_rl.signals``) without materialising ``[rows, T, V]`` logits.
- The number of generated tokens is random (temperature 1): the table shows each run's mean
  completion length. A batch decodes until its longest row stops, usually the 32-token cap.
- TRL's per-step bookkeeping (reward gathering, metric logging, learning-rate scheduler) is in
  its step time; gear-rl's ``time/step`` covers rollout, scoring, credit and update, and its
  per-step records, checkpoints and the end-of-run evaluation lie outside it.

Timing: TRL, a ``TrainerCallback``'s ``on_step_begin`` -> ``on_step_end`` (wall and process CPU
seconds; everything of one optimiser step, generation included), with TRL's own phases timed by
wrapping its methods (``_generate``: tokenise, sample, decode; ``_calculate_rewards``;
``_apply_credit``: GEARTrainer's signal pass and credit; the update is the rest); gear-rl, the
``time/step`` / ``time/step_cpu`` fields of ``metrics.jsonl`` and its phases ``time/rollout``,
``time/signals``, ``time/credit``, ``time/update``. Steps: one warm-up step, then ``--steps``
measured ones (default 3: the median of steps 2-4). ``--rounds R`` repeats the four runs R times
(the order reversed every other round) and takes the median over all measured steps.

Run:  python benchmarks/vs_trl.py [--steps 3] [--threads 2] [--configs trl_grpo,gearrl_grpo]
      [--micro-batch 32] [--rounds 1] [--json out.json] [key=value ...]
(keys as for ``gear-rl train``, applied to all four: e.g. ``model=tiny-random`` for a quick
check, ``rollout.max_new_tokens=64``). Goal (issue 15): TRL / gear-rl >= 2 for GRPO and for
GEAR, with gear-rl GEAR / GRPO <= 1.10. It measures wall time: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CONFIGS = ("trl_grpo", "trl_gear", "gearrl_grpo", "gearrl_gear")
ESTIMATOR = {"trl_grpo": "grpo", "trl_gear": "gear", "gearrl_grpo": "grpo", "gearrl_gear": "gear"}
GEARRL_PHASES = ("rollout", "signals", "credit", "update")
TRL_PHASES = ("generate", "reward", "credit", "other", "update")
# gear-rl keys every configuration shares: nothing outside the step that costs more than it
# must (the end-of-run evaluation still runs: eval.k=1 keeps it short; eval.size is left alone
# because it decides which problems are held out of training). The precision is added per run
# (``--precision``).
GEARRL_COMMON = ("eval.at_start=false", "eval.k=1", "log.progress=false",
                 "log.report_to=none", "log.samples_per_step=0", "log.checkpoint_every=0")


# ---------------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    """Processor model, the bf16 flags that decide autocast's speed, library versions."""
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(),
                            "cpus": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    info["flags"] = {name: name in flags for name in
                     ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")}
    import torch

    info["torch"] = torch.__version__
    info["torch_default_threads"] = torch.get_num_threads()
    info["cuda"] = torch.cuda.is_available()
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:
        info["trl"] = None
    import transformers

    info["transformers"] = transformers.__version__
    info["load_average"] = os.getloadavg()
    return info


# --------------------------------------------------------------------------- the TRL worker
def resolve_precision(precision: str) -> str:
    """``auto`` -> ``bf16`` where this machine computes bf16 natively, else ``fp32`` (the rule
    of gear-rl's own ``precision=auto``, from the same function)."""
    if precision != "auto":
        return precision
    from gear_rl.train.runtime import bf16_is_native, resolve_device

    return "bf16" if bf16_is_native(resolve_device("auto")) else "fp32"


def _trl_worker(name: str, steps: int, micro_batch: int, overrides: list[str],
                result_path: Path, gear_signals: str = "autocast") -> None:
    """Train ``steps`` steps with TRL (``name``: ``trl_grpo`` or ``trl_gear``) and write the
    per-step timings to ``result_path`` as JSON. ``gear_signals="autocast"`` runs
    GEARTrainer's signal pass under TRL's bf16 autocast (see the module docstring)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from gear_rl.integrations.trl import CreditGRPOConfig, GEARTrainer
    from gear_rl.signals import prompt_ids
    from gear_rl.train import Trainer, load_config
    from gear_rl.train.runtime import build_runtime

    # rollout.dtype=fp32: the runtime keeps no bf16 sampler copy (TRL samples from the policy)
    config = load_config(None, [*overrides, "rollout.dtype=fp32"])
    if config.precision not in ("bf16", "fp32"):
        raise ValueError(f"precision={config.precision!r}: the driver resolves it first")
    runtime = build_runtime(config)  # the trainer's own loading: model, tokenizer, task
    model, tokenizer, task = runtime.model, runtime.tokenizer, runtime.task
    if task.agent is not None or task.env is not None:
        raise ValueError(f"task {config.task!r} is multi-turn: the TRL comparison covers "
                         "single-turn tasks only")
    rollout, loss, optim = config.rollout, config.loss, config.optim
    if loss.epochs != 1 or loss.minibatches != 1 or loss.kl_coef != 0:
        raise ValueError("the comparison needs loss.epochs=1, loss.minibatches=1, kl_coef=0")
    batch = rollout.prompts_per_step * rollout.samples_per_prompt
    if batch % micro_batch:
        raise ValueError(f"--micro-batch {micro_batch} must divide the batch ({batch})")
    # The problems gear-rl trains on, step by step, in its order (its own method, so the order
    # cannot drift from the trainer's; it reads only config and task).
    visited = [problem for step in range(1, steps + 1)
               for problem in Trainer._problems_for_step(
                   SimpleNamespace(config=config, task=task), step)]  # type: ignore[arg-type]
    rows = [{"prompt": problem.prompt, "reference": problem.reference, "problem_index": i}
            for i, problem in enumerate(visited)]
    expected_ids = [prompt_ids(tokenizer, problem.prompt) for problem in visited]

    def reward(prompts: list, completions: list, problem_index: list[int],
               **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [task.score(visited[i], text) for i, text in zip(problem_index, texts,
                                                                strict=True)]

    common: dict[str, Any] = dict(
        output_dir=str(result_path.parent / f"{name}-out"), max_steps=steps,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=batch // micro_batch,
        num_generations=rollout.samples_per_prompt, num_iterations=1,
        max_completion_length=rollout.max_new_tokens, temperature=rollout.temperature,
        top_p=rollout.top_p, top_k=0, beta=0.0, loss_type="dapo",
        epsilon=loss.clip_low, epsilon_high=loss.clip_high, scale_rewards="group",
        learning_rate=optim.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=optim.weight_decay, adam_beta1=optim.beta1, adam_beta2=optim.beta2,
        adam_epsilon=optim.eps, max_grad_norm=optim.grad_clip, optim="adamw_torch",
        bf16=config.precision == "bf16", use_cpu=runtime.device.type == "cpu",
        gradient_checkpointing=False,
        shuffle_dataset=False, remove_unused_columns=False, seed=config.seed,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False,
    )
    if name == "trl_gear":
        signals = config.signals
        args: GRPOConfig = CreditGRPOConfig(
            **common, estimator="gear", credit=dict(config.credit),
            reference_column="reference", reference_kind=visited[0].reference_kind,
            teacher_placement=signals.placement,
            teacher_answer_template=signals.answer_template, divergence=signals.divergence,
            divergence_topk=signals.topk, signal_chunk_size=signals.chunk_size)
        trainer_cls: type[GRPOTrainer] = GEARTrainer
    else:
        args = GRPOConfig(**common)
        trainer_cls = GRPOTrainer

    records: list[dict[str, Any]] = []
    phases: dict[str, float] = collections.defaultdict(float)
    checks = {"prompts_match": True, "order_match": True}
    log_entries: list[dict[str, Any]] = []
    tokens_per_response: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            phases.clear()
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
            record = {"step": state.global_step, "time/step": wall, "time/step_cpu": cpu,
                      **{f"time/{k}": v for k, v in phases.items()}}
            record["time/update"] = wall - phases.get("rollout_total", 0.0)
            record["time/other"] = phases.get("rollout_total", 0.0) - sum(
                phases.get(k, 0.0) for k in ("generate", "reward", "credit"))
            records.append(record)
            print(f"  [{name}] step {state.global_step}: {wall:.2f} s, {cpu:.2f} CPU s ("
                  + ", ".join(f"{k} {record.get(f'time/{k}', 0.0):.2f}" for k in TRL_PHASES)
                  + ")", file=sys.stderr, flush=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                log_entries.append({"step": state.global_step, **logs})

    trainer = trainer_cls(model=model, reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[StepTimer()])

    def timed(phase: str, method: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                phases[phase] += time.perf_counter() - started
        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    if hasattr(trainer, "_apply_credit"):
        integration_credit = trainer._apply_credit

        def credit_autocast(*a: Any, **k: Any) -> Any:
            with trainer.accelerator.autocast():  # TRL's own mixed-precision context
                return integration_credit(*a, **k)

        trainer._apply_credit = timed("credit", credit_autocast if gear_signals == "autocast"
                                      else integration_credit)
    generate_and_score = timed("rollout_total", trainer._generate_and_score_completions)
    position = [0]

    def checked(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = generate_and_score(inputs)
        for example, ids, mask in zip(inputs, output["prompt_ids"], output["prompt_mask"],
                                      strict=True):
            index = example["problem_index"]
            if index != position[0] // rollout.samples_per_prompt:
                checks["order_match"] = False
            position[0] += 1
            if ids[mask.bool()].tolist() != expected_ids[index]:
                checks["prompts_match"] = False
        tokens_per_response.append(float(output["completion_mask"].sum()) / len(inputs))
        return output

    trainer._generate_and_score_completions = checked
    torch.manual_seed(config.seed)
    trainer.train()
    rewards = {entry["step"]: entry["reward"] for entry in log_entries if "reward" in entry}
    for record, tokens in zip(records, tokens_per_response, strict=False):
        record["response_len"] = tokens
        record["reward_mean"] = rewards.get(record["step"], float("nan"))
    result_path.write_text(json.dumps({
        "records": records, "checks": checks, "logs": log_entries,
        "threads": torch.get_num_threads(), "device": str(runtime.device),
        "gear_signals": gear_signals if name == "trl_gear" else None,
        "trl_args": {key: getattr(args, key) for key in (
            *common, "steps_per_generation", "generation_batch_size")
            if key != "output_dir"},
    }, default=str))


# ------------------------------------------------------------------------- the driver side
def _run(command: list[str], env: dict[str, str], label: str, timeout: float
         ) -> tuple[int, list[str]]:
    """Run ``command`` (killed after ``timeout`` seconds), echoing its step lines and error
    lines prefixed by ``label``; returns the exit status and its last output lines."""
    tail: collections.deque[str] = collections.deque(maxlen=60)
    # its own process group, so that a kill also reaches anything it started
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1,
                               start_new_session=True)

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    assert process.stdout is not None
    try:
        for line in process.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            if line.startswith("  ["):
                print(line, file=sys.stderr, flush=True)
            elif "error" in line.lower():
                print(f"  [{label}] {line}", file=sys.stderr, flush=True)
        status = process.wait()
        if not watchdog.is_alive() and status != 0:
            tail.append(f"killed after {timeout:.0f} s (--timeout)")
        return status, list(tail)
    finally:
        watchdog.cancel()
        if process.poll() is None:
            kill()
            process.wait()


def run_config(name: str, *, steps: int, threads: int, micro_batch: int,
               overrides: list[str], workdir: Path, timeout: float,
               trl_gear_signals: str = "autocast", precision: str = "bf16"
               ) -> dict[str, Any]:
    """One configuration in its own process; returns its per-step records or its error.
    ``micro_batch`` is TRL's ``per_device_train_batch_size`` (gear-rl packs its own)."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    total = steps + 1  # one warm-up step
    shared = [f"threads={threads}", f"precision={precision}", *overrides]
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if name.startswith("trl_"):
        result_path = folder / "result.json"
        command = [sys.executable, os.path.abspath(__file__), "--worker", name,
                   "--steps", str(total), "--micro-batch", str(micro_batch),
                   "--result", str(result_path), "--trl-gear-signals", trl_gear_signals,
                   *shared]
    else:
        run_dir = folder / "run"
        command = [sys.executable, "-m", "gear_rl.cli", "train", f"estimator={ESTIMATOR[name]}",
                   f"steps={total}", f"out={run_dir}", *GEARRL_COMMON, *shared]
    print(f"[{name}] {' '.join(command[1:])}", file=sys.stderr, flush=True)
    status, tail = _run(command, env, name, timeout)
    out: dict[str, Any] = {"config": name, "returncode": status,
                           "wall_s": time.perf_counter() - started}
    try:
        if status != 0:
            raise RuntimeError(f"exit status {status}")
        if name.startswith("trl_"):
            data = json.loads(result_path.read_text())
            out.update(records=data["records"], checks=data["checks"],
                       threads=data["threads"], device=data["device"],
                       trl_args=data["trl_args"], logs=data["logs"])
        else:
            import yaml

            saved = yaml.safe_load((run_dir / "config.yaml").read_text())
            out.update(loss_config=saved["loss"], threads=saved["threads"])
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
            out["records"] = [r for r in records if "time/step" in r]
            for record in out["records"]:
                print(f"  [{name}] step {record['step']}: {record['time/step']:.2f} s, "
                      f"{record['time/step_cpu']:.2f} CPU s (" + ", ".join(
                          f"{p} {record[f'time/{p}']:.2f}" for p in GEARRL_PHASES)
                      + f"); {record['response_len']:.1f} tok/resp", file=sys.stderr)
        if len(out["records"]) != total:
            raise RuntimeError(f"{len(out['records'])} step records, expected {total}")
    except (OSError, RuntimeError, ValueError, KeyError) as error:
        out["error"] = f"{error}\n" + "\n".join(tail[-30:])
        print(f"[{name}] FAILED: {out['error']}", file=sys.stderr, flush=True)
    return out


def summarize(results: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Medians per configuration over the measured steps (the warm-up step of every run left
    out), and the issue's ratios."""
    by_name: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    errors: dict[str, str] = {}
    for result in results:
        if "error" in result:
            errors[result["config"]] = result["error"]
            continue
        by_name[result["config"]].extend(result["records"][1:])  # drop the warm-up step
    summary: dict[str, Any] = {"configs": {}, "errors": errors}
    for name, records in by_name.items():
        phases = GEARRL_PHASES if name.startswith("gearrl_") else TRL_PHASES
        entry = {"median_s": statistics.median(r["time/step"] for r in records),
                 "median_cpu_s": statistics.median(r["time/step_cpu"] for r in records),
                 "steps_s": [round(r["time/step"], 3) for r in records],
                 "response_len": statistics.mean(r.get("response_len", float("nan"))
                                                 for r in records),
                 "reward_mean": statistics.mean(r.get("reward_mean", float("nan"))
                                                for r in records),
                 "phases_median_s": {p: statistics.median(r.get(f"time/{p}", 0.0)
                                                          for r in records) for p in phases}}
        checks = [r.get("checks") for r in results if r["config"] == name and r.get("checks")]
        if checks:
            entry["checks"] = {k: all(c[k] for c in checks) for k in checks[0]}
        summary["configs"][name] = entry
    medians = {name: entry["median_s"] for name, entry in summary["configs"].items()}
    cpu = {name: entry["median_cpu_s"] for name, entry in summary["configs"].items()}
    ratios: dict[str, float] = {}
    for label, (a, b) in {"trl_grpo/gearrl_grpo": ("trl_grpo", "gearrl_grpo"),
                          "trl_gear/gearrl_gear": ("trl_gear", "gearrl_gear"),
                          "gearrl_gear/gearrl_grpo": ("gearrl_gear", "gearrl_grpo"),
                          "trl_gear/trl_grpo": ("trl_gear", "trl_grpo")}.items():
        if a in medians and b in medians:
            ratios[label] = medians[a] / medians[b]
            ratios[label + " (CPU s)"] = cpu[a] / cpu[b]
    summary["ratios"] = ratios
    summary["gearrl_loss"] = next((r["loss_config"] for r in results if "loss_config" in r),
                                  None)
    return summary


GOALS = {"trl_grpo/gearrl_grpo": ">= 2", "trl_gear/gearrl_gear": ">= 2",
         "gearrl_gear/gearrl_grpo": "<= 1.10", "trl_gear/trl_grpo": "(for reference)"}


def print_table(summary: dict[str, Any], info: dict[str, Any], threads: int) -> None:
    flags = info["flags"]
    print(f"machine: {info['cpu']}, {info['cpus']} CPUs; avx512f {flags['avx512f']}, "
          f"avx512_bf16 {flags['avx512_bf16']}, amx_bf16 {flags['amx_bf16']}; torch "
          f"{info['torch']}, {threads} threads, precision {info.get('precision')}; "
          f"trl {info['trl']}, transformers "
          f"{info['transformers']}; load average at start "
          + " ".join(f"{x:.2f}" for x in info["load_average"]) + ", at the end "
          + " ".join(f"{x:.2f}" for x in info.get("load_average_end", ())))
    print(f"{'config':<13} {'median s/step':>13} {'CPU s/step':>10}  {'tok/resp':>8}  "
          f"{'reward':>6}  steps (s)")
    for name in CONFIGS:
        entry = summary["configs"].get(name)
        if entry is None:
            error = summary["errors"].get(name)
            if error is not None:
                print(f"{name:<13} FAILED: {error.splitlines()[0]}")
            continue
        checks = entry.get("checks")
        note = "" if not checks or all(checks.values()) else f"  CHECK FAILED {checks}"
        print(f"{name:<13} {entry['median_s']:>13.2f} {entry['median_cpu_s']:>10.2f}  "
              f"{entry['response_len']:>8.1f}  {entry['reward_mean']:>6.3f}  "
              f"{entry['steps_s']}{note}")
    for label, value in summary["ratios"].items():
        goal = GOALS.get(label, "")
        print(f"  {label:<32} {value:6.2f}  {goal}")
    if summary.get("gearrl_loss"):
        print("gear-rl loss settings: " + ", ".join(
            f"{key}={value}" for key, value in summary["gearrl_loss"].items()))
    for kind, phases in (("gearrl_", GEARRL_PHASES), ("trl_", TRL_PHASES)):
        names = [n for n in CONFIGS if n.startswith(kind) and n in summary["configs"]]
        if not names:
            continue
        print(f"{'phase medians (s)':<18}" + "".join(f"{p:>10}" for p in phases)
              + ("" if kind == "gearrl_" else "   (TRL: generate = tokenise + sample + "
                 "decode; credit = GEARTrainer's signal pass + credit; other = the rest of "
                 "_generate_and_score_completions; update = the rest of the step)"))
        for name in names:
            values = summary["configs"][name]["phases_median_s"]
            print(f"  {name:<16}" + "".join(f"{values[p]:>10.2f}" for p in phases))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3,
                        help="measured steps per run, after one warm-up step")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--micro-batch", type=int, default=32,
                        help="TRL's per_device_train_batch_size (rows per forward/backward; "
                             "gradient accumulation makes up the batch); gear-rl packs its "
                             "own (loss.micro_batch_tokens)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the runs this many times (order reversed every other "
                             "round); medians over all measured steps")
    parser.add_argument("--trl-gear-signals", choices=("autocast", "as-is"), default="autocast",
                        help="trl_gear: run GEARTrainer's signal pass under TRL's bf16 autocast "
                             "(default, the same precision as gear-rl's) or as the integration "
                             "runs it (fp32: it calls the backbone outside TRL's autocast)")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                        help="compute precision of every run: bf16 autocast or fp32; auto: "
                             "bf16 where the processor computes it natively, else fp32")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds before one run is killed")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", choices=("trl_grpo", "trl_gear"), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (all runs)")
    args = parser.parse_args()
    if args.worker:
        _trl_worker(args.worker, args.steps, args.micro_batch, args.overrides, args.result,
                    args.trl_gear_signals)
        return 0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or not names:
        parser.error(f"--configs: unknown {unknown}; choose from {','.join(CONFIGS)}")
    if args.steps < 1 or args.threads < 1 or args.rounds < 1 or args.micro_batch < 1:
        parser.error("--steps, --threads, --rounds and --micro-batch must be >= 1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    info = machine_info()
    precision = resolve_precision(args.precision)
    info["precision"] = precision
    results = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs_trl-") as tmp:
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                results.append(run_config(
                    name, steps=args.steps, threads=args.threads,
                    micro_batch=args.micro_batch, overrides=args.overrides,
                    workdir=Path(tmp) / f"round{round_index}", timeout=args.timeout,
                    trl_gear_signals=args.trl_gear_signals, precision=precision))
    summary = summarize(results, args.steps)
    info["load_average_end"] = os.getloadavg()
    print_table(summary, info, args.threads)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "threads": args.threads, "steps": args.steps,
            "micro_batch": args.micro_batch, "rounds": args.rounds,
            "trl_gear_signals": args.trl_gear_signals,
            "overrides": args.overrides, "summary": summary,
            "runs": [{k: v for k, v in r.items() if k != "logs"} for r in results],
            "trl_logs": {r["config"]: r.get("logs") for r in results if "logs" in r},
            "wall_s": time.perf_counter() - started}, indent=1, default=str))
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
