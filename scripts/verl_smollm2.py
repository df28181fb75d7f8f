"""SmolLM2-135M-Instruct through the real CPU verl job, on a task of ``gear-rl train`` with the
budget of one of its studies, for comparison with ``gear-rl train`` on the same task and budget
(docs/verl.md, "The real model through verl").

``--setting products`` (the default): the default task of ``gear-rl train`` (reasoning-gym
``products``, one-digit factors: the same training problems and the first 64 held-out
problems, prompts as ``gear-rl train`` shows them, reference in ``reward_model.ground_truth``),
and its budget and optimiser: GEAR, 10 steps of 4
prompts x 8 samples, 32 new tokens at T=1.0, AdamW lr 3e-5 without weight decay, clip
0.2 / 0.28, grad clip 1.0, token-mean loss, one update a step. verl's validation before and after
training plays ``gear-rl train``'s held-out evaluation: Mean@4 on 64 problems at T=0.6,
top-p 0.95, 32 new tokens. The reward is gear-rl's ``math_verify_reward``
(``gear_rl.integrations.verl.rewards``).

``--setting sokoban``: ``studies/sokoban.yaml``'s task and budget (text Sokoban, one box, levels
solved in 1-3 moves; the same 400 training and 32 held-out levels, seed 0, as ``gear-rl train
task=sokoban`` draws them; up to 6 turns of up to 24 tokens, 384 response tokens in all),
played by gear-rl's ``gear_env`` agent loop; GiGPO by default; 10 steps of 4 levels x 8
episodes at T=1.0, the same optimiser; held-out Mean@2 on the 32 levels at T=0.6, top-p 0.95.
The reward is the solve (1.0), the step-level estimators get the shaped per-move rewards.

    .venv/verl-cpu/bin/python scripts/verl_smollm2.py [--setting products|sokoban]
        [--estimator NAME] [--steps 10] [--out DIR] [hydra overrides...]

Prints validation accuracy before and after and the median seconds a step spends in each phase
(verl's ``timing_s/*``), and writes them to ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

from gear_rl.integrations.verl import cpu_job

PHASES = ("gen", "reward", "old_log_prob", "gear_teacher", "gear_values", "adv", "update_actor",
          "update_weights", "step")


def write_products(out: Path) -> None:
    """gear-rl's default task as verl parquet, prompts exactly as ``gear-rl train`` has them
    (the CPU mode's ``products`` setting)."""
    cpu_job.write_default_data("products", out)


SOKOBAN_OPTIONS = {"num_boxes": 1, "min_solution_length": 1, "max_solution_length": 3}
"""``studies/sokoban.yaml``'s task options."""


def write_sokoban(out: Path, *, train_size: int = 400, eval_size: int = 32) -> None:
    """``studies/sokoban.yaml``'s levels as verl parquet rows for the ``gear_env`` loop: the
    levels ``gear-rl train`` draws for that study (seed 0), 6 turns of 24 tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gear_rl.integrations.verl.data import env_data_rows

    train, test = env_data_rows("sokoban", options=SOKOBAN_OPTIONS, train_size=train_size,
                                eval_size=eval_size, seed=0, max_turns=6,
                                max_new_tokens_per_turn=24)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        pq.write_table(pa.Table.from_pylist(rows), out / f"{name}.parquet")


# per setting: (data writer, verl SETTING, default estimator, response tokens, held-out k,
# held-out batch, micro batch: a Sokoban row is up to 896 tokens and the actor's fp32 logits
# over the whole vocabulary take 0.2 MB a token)
SETUPS = {"products": (write_products, "products", "gear", 32, 4, 64, 32),
          "sokoban": (write_sokoban, "sokoban", "gigpo", 384, 2, 32, 2)}


class PeakMemory:
    """Samples, every ``every_s`` seconds in a thread, the largest resident set of any one
    process of the job (``/proc/*/status`` ``VmRSS`` of the processes whose environment holds
    ``marker``, the job's own ``GEAR_DATA=<workdir>``: the driver, the actor and vLLM workers,
    which inherit it), their sum, and the machine's memory in use (``MemTotal -
    MemAvailable``, whatever else runs); ``peak()`` gives the three in GB."""

    def __init__(self, marker: str, every_s: float = 2.0) -> None:
        import threading

        self.marker = marker.encode()
        self.every_s, self.rss, self.total, self.used = every_s, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import os

        total = 0
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if os.stat(proc).st_uid != os.getuid():
                    continue
                if self.marker not in (proc / "environ").read_bytes().split(b"\0"):
                    continue
                text = (proc / "status").read_text()
            except OSError:
                continue
            match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
            if match:
                self.rss = max(self.rss, int(match.group(1)) * 1024)
                total += int(match.group(1)) * 1024
        self.total = max(self.total, total)
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        used = (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024
        self.used = max(self.used, used)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self) -> dict[str, float]:
        return {"largest_process_rss_gb": round(self.rss / 2**30, 2),
                "job_rss_sum_gb": round(self.total / 2**30, 2),
                "machine_used_gb": round(self.used / 2**30, 2)}


def _without_out(args: list[str]) -> list[str]:
    """The command's arguments less ``--out DIR`` (a path of this machine)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETUPS), default="products")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=None, help="default runs/verl-smollm2-<setting>")
    parser.add_argument("--estimator", default=None,
                        help="default gear (products), gigpo (sokoban)")
    args, extra = parser.parse_known_args(argv)
    writer, setting, default_estimator, response, k, val_batch, micro = SETUPS[args.setting]
    estimator = args.estimator or default_estimator
    out = Path(args.out or f"runs/verl-smollm2-{args.setting}").resolve()
    data = out / "data"
    writer(data)
    gear_mode = "sync" if estimator == "grpo" else "gear"
    overrides = [
        "actor_rollout_ref.model.path=smollm2",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        "data.train_batch_size=4", f"data.max_response_length={response}",
        f"data.val_batch_size={val_batch}",
        f"algorithm.adv_estimator={estimator}", f"trainer.v1.trainer_mode={gear_mode}",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        f"actor_rollout_ref.rollout.val_kwargs.n={k}",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.95",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.actor.optim.lr=3e-5", "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        *(["reward.custom_reward_function.name=math_verify_reward"]
          if args.setting == "products" else []),
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=True",
        f"trainer.test_freq={args.steps}", f"trainer.default_local_dir={out}/checkpoints",
        f"trainer.rollout_data_dir={out}/rollouts", *extra]
    plan = cpu_job.plan_job(overrides, setting=setting, workdir=out)
    log_path = out / "job.log"
    started = time.perf_counter()
    with PeakMemory(f"GEAR_DATA={plan.env['GEAR_DATA']}") as memory:
        rc = cpu_job.run_job(plan, log_path=log_path)
    wall = time.perf_counter() - started
    log = log_path.read_text() if log_path.is_file() else ""  # a job stopped early
    steps = cpu_job.console_metrics(log)
    val = {step: {k: v for k, v in values.items() if k.startswith("val-core/")}
           for step, values in steps.items()}
    val = {step: v for step, v in val.items() if v}
    initial = re.findall(r"Initial validation metrics: (\{.*\})", log)
    timing = {phase: statistics.median(v[f"timing_s/{phase}"] for s, v in steps.items()
                                       if s > 1 and f"timing_s/{phase}" in v)
              for phase in PHASES if any(f"timing_s/{phase}" in v for v in steps.values())}
    continuation = [v["gear/mc_continuation_tokens"] for s, v in steps.items()
                    if s > 1 and "gear/mc_continuation_tokens" in v]
    if continuation:  # the Monte-Carlo values phase (spo_chain, vineppo)
        timing["mc_continuation_tokens"] = statistics.median(continuation)
    summary = {"rc": rc, "setting": args.setting, "estimator": estimator, "steps": len(steps),
               "initial_validation": initial[-1] if initial else None,
               "validation": val, "median_s_after_step_1": timing,
               "first_step_s": steps.get(1, {}).get("timing_s/step"),
               "wall_s": round(wall, 1), "peak_memory": memory.peak(),
               "command": " ".join(["python scripts/verl_smollm2.py", *_without_out(
                   argv if argv is not None else sys.argv[1:])])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
