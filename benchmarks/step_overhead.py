"""GEAR's cost over GRPO in the built-in trainer, and the rollout engine against model.generate.

1. Step time: a GEAR trainer and a GRPO trainer on the same config (default: SmolLM2-135M on the
   default task), alternating steps in one process. The learning rate is set to 1e-12, so both
   keep the starting weights and, with the same seed, sample nearly the same batches (the two
   model copies can differ in the last float bits, which now and then flips a sampled token;
   ``same_batches`` in the output says whether every step's batch matched): the difference
   left is GEAR's signal pass (one no-grad teacher forward and the divergence) and its credit
   computation. Goal (issue 15): median GEAR step / median GRPO step <= 1.10 (it was 1.15).
2. Rollout: the trainer's KV-cache sampler against ``model.generate`` (sampling, same
   temperature and top-p, same stop tokens, same ``max_new_tokens``) on the same prompt batch,
   alternating. Throughput counts tokens up to each row's first stop token. Goal: >= 1.0x.
   Single-turn tasks only: an agent or environment task's rollout is a loop of turns with tool
   calls or moves in between, which ``model.generate`` has no counterpart for, so it is skipped.

``--tasks products,tool-math`` runs part 1 on each task in turn (part 2 on the first single-turn
one), with the task's documented settings (:data:`TASK_SETTINGS`) under the command line's
``key=value`` overrides. ``tool-math`` is the agent task (two-digit products, the policy may
write Python that runs in the sandbox and whose output comes back as observation tokens): its
documented run (README, "Agents") is 4 x 8 at ``rollout.temperature=0.7``, with the
``agent.*`` turn limits at their defaults (3 turns, 64 new tokens per turn, 384 response
tokens). The tool calls run in the sandbox's worker processes: their time is in the wall
times, not in the CPU seconds (which count this process only); ``agent/tool_call_rate`` and
the tokens per response are printed for each step, since the two estimators sample the same
episodes only while the weights stay frozen. Memory: the two SmolLM2 trainers share one process;
on tool-math (longer sequences) it peaked at 9.3 GB resident with ``--steps 1`` and 10.2 GB
with ``--steps 3`` (tool-math alone); leave that much free.

Run:  python benchmarks/step_overhead.py [--steps 3] [--generate-repeats 2]
      [--tasks products,tool-math] [key=value ...]
(keys as for ``gear-rl train``; e.g. ``model=tiny-random`` for a quick check). Prints a table and
one JSON line per task. On a shared CPU, run it when the machine is quiet: it measures wall time.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from gear_rl.models import load_policy
from gear_rl.sampling import SamplingParams, sample_responses
from gear_rl.train import Trainer, load_config


def _useful_tokens(rows: list[list[int]], stops: set[int]) -> int:
    total = 0
    for row in rows:
        for token in row:
            total += 1
            if token in stops:
                break
    return total


PHASES = ("rollout", "score", "credit", "update")

# Settings a task is documented with, applied before the command line's overrides (which win).
# tool-math: the README's measured run ("Agents": 4 steps of 4 x 8 at T=0.7).
TASK_SETTINGS: dict[str, tuple[str, ...]] = {"tool-math": ("rollout.temperature=0.7",)}


def _time_phases_cpu(trainer: Trainer) -> dict[str, float]:
    """Wrap the trainer's step phases so each call adds its CPU seconds (this process, all
    threads) to the returned dict (keys :data:`PHASES`); the step records only wall time per
    phase, which on a shared machine measures the neighbours too."""
    seconds = dict.fromkeys(PHASES, 0.0)

    def timed(name: str, method):
        def wrapper(*args, **kwargs):
            started = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] += time.process_time() - started
        return wrapper

    for name in PHASES:
        setattr(trainer, name, timed(name, getattr(trainer, name)))
    return seconds


def bench_steps(overrides: list[str], steps: int, workdir: str) -> tuple[dict, Trainer]:
    """Median step/phase times (wall and CPU) of GEAR and GRPO, alternating, with frozen
    weights; also returns the GEAR trainer, which the caller closes."""
    common = [*overrides, "optim.lr=1e-12", "log.progress=false", "log.report_to=none",
              "log.samples_per_step=0", "log.checkpoint_every=0", "eval.at_start=false"]
    gear_config = load_config(None, [*common, "estimator=gear", f"out={workdir}/gear"])
    # Both trainers get a copy of one loaded model, so neither holds the weights in memory laid
    # out differently (a freshly loaded model's update ran ~8% slower than a copy's in one run).
    model, tokenizer = load_policy(gear_config.model, dtype=torch.float32, seed=gear_config.seed)
    gear = Trainer(gear_config, model=copy.deepcopy(model), tokenizer=tokenizer)
    try:
        grpo = Trainer(load_config(None, [*common, "estimator=grpo", f"out={workdir}/grpo"]),
                       model=copy.deepcopy(model), tokenizer=tokenizer, task=gear.task)
        del model
        try:
            return _alternate(gear, grpo, steps), gear
        finally:
            grpo.close()  # its sandbox workers, if any
    except BaseException:
        gear.close()
        raise


def _alternate(gear: Trainer, grpo: Trainer, steps: int) -> dict:
    """``steps`` + 1 steps of each trainer, alternating which goes first; medians of all but
    the first."""
    phase_cpu = {"gear": _time_phases_cpu(gear), "grpo": _time_phases_cpu(grpo)}
    times: dict[str, list[dict]] = {"gear": [], "grpo": []}
    for step in range(steps + 1):  # step 0 warms up (numba compile, allocator)
        order = [("gear", gear), ("grpo", grpo)]
        for name, trainer in order if step % 2 == 0 else order[::-1]:  # neither always first
            seconds = phase_cpu[name]
            for phase in PHASES:
                seconds[phase] = 0.0
            record, _ = trainer.step(step + 1)
            record.update({f"time/{phase}_cpu": seconds[phase] for phase in PHASES})
            if step > 0:
                times[name].append(record)
            print(f"  {name} step {step}: {record['time/step']:.2f} s, "
                  f"{record['time/step_cpu']:.2f} CPU s (wall / CPU: rollout "
                  f"{record['time/rollout']:.2f} / {record['time/rollout_cpu']:.2f}, signals "
                  f"{record['time/signals']:.2f} / {record['time/score_cpu']:.2f}, credit "
                  f"{record['time/credit']:.2f} / {record['time/credit_cpu']:.2f}, update "
                  f"{record['time/update']:.2f} / {record['time/update_cpu']:.2f}); "
                  f"{record['response_len']:.1f} tok/resp{_agent_note(record)}",
                  file=sys.stderr, flush=True)
    out = {}
    for name, records in times.items():
        for key in ("time/step", "time/step_cpu", "time/rollout", "time/signals", "time/credit",
                    "time/update", *(f"time/{phase}_cpu" for phase in PHASES)):
            out[f"{name}_{key.split('/')[1]}_median_s"] = statistics.median(r[key] for r in
                                                                            records)
    out["gear_over_grpo_step"] = out["gear_step_median_s"] / out["grpo_step_median_s"]
    # CPU seconds of the process: less sensitive than wall time to other busy processes.
    out["gear_over_grpo_step_cpu"] = (out["gear_step_cpu_median_s"]
                                      / out["grpo_step_cpu_median_s"])
    out["same_batches"] = all(a["reward_mean"] == b["reward_mean"]
                              and a["response_len"] == b["response_len"]
                              and a.get("agent/tool_call_rate") == b.get("agent/tool_call_rate")
                              for a, b in zip(times["gear"], times["grpo"], strict=True))
    for key in ("response_len", "agent/tool_call_rate", "agent/observation_token_fraction"):
        if key in times["gear"][0]:
            out[f"{key.split('/')[-1]}_mean"] = statistics.mean(
                r[key] for name in times for r in times[name])
    return out


def _agent_note(record: dict) -> str:
    """The step's tool use, for agent tasks ('' otherwise)."""
    if "agent/tool_call_rate" not in record:
        return ""
    return (f", tool calls in {record['agent/tool_call_rate']:.0%} of episodes, observation "
            f"tokens {record['agent/observation_token_fraction']:.0%}")


def bench_rollout(trainer: Trainer, repeats: int) -> dict:
    """The trainer's sampler vs ``model.generate`` on one step's prompt batch."""
    config = trainer.config.rollout
    problems = [p for p in trainer._problems_for_step(1) for _ in range(config.samples_per_prompt)]
    prompts = [trainer._prompts(p)[0] for p in problems]
    model, stops = trainer.sampler, set(trainer.stop_ids)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), trainer.pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    device = next(model.parameters()).device
    input_ids, attention = input_ids.to(device), attention.to(device)
    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, stop_ids=stops,
                              pad_id=trainer.pad_id, temperature=config.temperature,
                              top_p=config.top_p)
    ours, theirs = [], []
    for repeat in range(repeats):
        generator = torch.Generator(device=device).manual_seed(repeat)
        started = time.perf_counter()
        result = sample_responses(model, prompts, sampling, generator=generator)
        seconds = time.perf_counter() - started
        ours.append(result.num_tokens / seconds)
        torch.manual_seed(repeat)
        started = time.perf_counter()
        with torch.no_grad():
            generated = model.generate(
                input_ids=input_ids, attention_mask=attention, do_sample=True,
                temperature=config.temperature, top_p=config.top_p, top_k=0,
                max_new_tokens=config.max_new_tokens, eos_token_id=sorted(stops),
                pad_token_id=trainer.pad_id,
            )
        seconds = time.perf_counter() - started
        rows = generated[:, width:].tolist()
        theirs.append(_useful_tokens(rows, stops) / seconds)
        print(f"  rollout repeat {repeat}: ours {ours[-1]:.0f} tok/s, generate "
              f"{theirs[-1]:.0f} tok/s", file=sys.stderr, flush=True)
    return {"rollout_rows": len(prompts), "ours_tok_per_s": statistics.median(ours),
            "generate_tok_per_s": statistics.median(theirs),
            "ours_over_generate": statistics.median(ours) / statistics.median(theirs)}


def _task_overrides(task: str | None, overrides: list[str]) -> list[str]:
    """``overrides`` for one entry of ``--tasks`` (None: the command line's alone): ``task=``,
    then the task's documented settings, then the command line's keys (which win)."""
    if task is None:
        return list(overrides)
    name = task.partition(":")[0]
    return [f"task={task}", *TASK_SETTINGS.get(name, ()), *overrides]


def _report(task: str, steps: dict, rollout: dict | None) -> None:
    print(f"[{task}] GEAR step {steps['gear_step_median_s']:.2f} s / GRPO step "
          f"{steps['grpo_step_median_s']:.2f} s = {steps['gear_over_grpo_step']:.3f} "
          f"(goal <= 1.10); in CPU seconds {steps['gear_over_grpo_step_cpu']:.3f}; signals "
          f"{steps['gear_signals_median_s']:.2f} s vs {steps['grpo_signals_median_s']:.2f} s; "
          f"same batches: {steps['same_batches']}")
    print(f"[{task}] median CPU s per phase, GEAR / GRPO: " + ", ".join(
        f"{phase} {steps[f'gear_{phase}_cpu_median_s']:.2f} / "
        f"{steps[f'grpo_{phase}_cpu_median_s']:.2f}" for phase in PHASES)
        + f"; {steps['response_len_mean']:.1f} tok/resp"
        + (f", tool calls in {steps['tool_call_rate_mean']:.0%} of episodes"
           if "tool_call_rate_mean" in steps else ""))
    if rollout is not None:
        print(f"[{task}] rollout {rollout['ours_tok_per_s']:.0f} tok/s vs model.generate "
              f"{rollout['generate_tok_per_s']:.0f} tok/s = {rollout['ours_over_generate']:.2f}x"
              " (goal >= 1.0)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per estimator")
    parser.add_argument("--generate-repeats", type=int, default=2,
                        help="rollout-vs-generate repeats (0: skip that part)")
    parser.add_argument("--tasks", help="comma-separated tasks to run one after another, each "
                        "with its documented settings (e.g. products,tool-math); default: the "
                        "task of the overrides")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    tasks: list[str | None] = [None]
    if args.tasks:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        if not tasks or any(o.startswith("task=") for o in args.overrides):
            parser.error("--tasks takes the place of task=: give one or the other")
    rollout_done = args.generate_repeats < 1
    for task in tasks:
        started = time.perf_counter()
        overrides = _task_overrides(task, args.overrides)
        rollout = None
        with tempfile.TemporaryDirectory() as workdir:
            steps, trainer = bench_steps(overrides, args.steps, workdir)
            try:
                single_turn = trainer.task.agent is None and trainer.task.env is None
                if single_turn and not rollout_done:
                    rollout = bench_rollout(trainer, args.generate_repeats)
                    rollout_done = True
                elif not single_turn:
                    print(f"  rollout vs model.generate skipped: {trainer.config.task} is "
                          "multi-turn", file=sys.stderr)
            finally:
                trainer.close()
        name = trainer.config.task
        result = {"task": name, "overrides": overrides,
                  "threads": trainer.config.threads or torch.get_num_threads(),
                  "load_average": os.getloadavg(), **steps, **(rollout or {}),
                  "wall_s": time.perf_counter() - started}
        _report(name, steps, rollout)
        print(json.dumps(result), flush=True)
        # Free this task's trainer (policy, sampler, optimiser) before the next task builds two.
        del trainer
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
