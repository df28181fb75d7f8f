"""SmolLM2-135M-Instruct through the real CPU verl job on gear-rl's default task, for comparison
with ``gear-rl train`` on the same task and budget (docs/verl.md, "The real model through verl").

The default task of ``gear-rl train`` (reasoning-gym ``products``, one-digit factors: the same
training problems and the first 64 held-out problems, prompts as ``gear-rl train`` shows them,
reference in ``reward_model.ground_truth``), and its budget and optimiser: GEAR, 10 steps of 4
prompts x 8 samples, 32 new tokens at T=1.0, AdamW lr 3e-5 without weight decay, clip
0.2 / 0.28, grad clip 1.0, token-mean loss, one update a step. verl's validation before and after
training plays ``gear-rl train``'s held-out evaluation: Mean@4 on 64 problems at T=0.6,
top-p 0.95, 32 new tokens. The reward is gear-rl's ``math_verify_reward``
(``gear_rl.integrations.verl.rewards``).

    .venv/verl-cpu/bin/python scripts/verl_smollm2_products.py [--steps 10] [--out DIR]

Prints validation accuracy before and after and the median seconds a step spends in each phase
(verl's ``timing_s/*``), and writes them to ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from gear_rl.integrations.verl import cpu_job

PHASES = ("gen", "reward", "old_log_prob", "gear_teacher", "adv", "update_actor",
          "update_weights", "step")


def write_products(out: Path, *, eval_size: int = 64) -> None:
    """gear-rl's default task as verl parquet: prompts exactly as ``gear-rl train`` has them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gear_rl.tasks import load_task

    task = load_task("products", seed=0)
    out.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train", task.train), ("test", task.eval[:eval_size])):
        rows = [{"data_source": "gear_rl/products", "prompt": p.prompt, "ability": "math",
                 "reward_model": {"style": "rule", "ground_truth": p.answer},
                 "extra_info": {"split": name, "index": i, "id": p.id}}
                for i, p in enumerate(problems)]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{name}.parquet")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/verl-smollm2")
    parser.add_argument("--estimator", default="gear")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out).resolve()
    data = out / "math"
    write_products(data)
    gear_mode = "sync" if args.estimator == "grpo" else "gear"
    overrides = [
        "actor_rollout_ref.model.path=smollm2",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        "data.train_batch_size=4", "data.max_response_length=32", "data.val_batch_size=64",
        f"algorithm.adv_estimator={args.estimator}", f"trainer.v1.trainer_mode={gear_mode}",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.val_kwargs.n=4",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.95",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.actor.optim.lr=3e-5", "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "reward.custom_reward_function.name=math_verify_reward",
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=True",
        f"trainer.test_freq={args.steps}", f"trainer.default_local_dir={out}/checkpoints",
        f"trainer.rollout_data_dir={out}/rollouts", *extra]
    plan = cpu_job.plan_job(overrides, setting="math", workdir=out)
    log_path = out / "job.log"
    rc = cpu_job.run_job(plan, log_path=log_path)
    log = log_path.read_text()
    steps = cpu_job.console_metrics(log)
    val = {step: {k: v for k, v in values.items() if k.startswith("val-core/")}
           for step, values in steps.items()}
    val = {step: v for step, v in val.items() if v}
    initial = re.findall(r"Initial validation metrics: (\{.*\})", log)
    timing = {phase: statistics.median(v[f"timing_s/{phase}"] for s, v in steps.items()
                                       if s > 1 and f"timing_s/{phase}" in v)
              for phase in PHASES if any(f"timing_s/{phase}" in v for v in steps.values())}
    summary = {"rc": rc, "estimator": args.estimator, "steps": len(steps),
               "initial_validation": initial[-1] if initial else None,
               "validation": val, "median_s_after_step_1": timing,
               "first_step_s": steps.get(1, {}).get("timing_s/step")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
