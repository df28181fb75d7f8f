"""A short real TRL run with gear-rl's CreditGRPOTrainer (GEAR), run log on, SmolLM2-135M-Instruct
(the bundled model, as a local HF folder) on reasoning-gym products (gear-rl's task and scorer)."""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch, datasets
from gear_rl.integrations.trl import CreditGRPOConfig, CreditGRPOTrainer
from gear_rl.models.smollm2 import ensure_smollm2
from gear_rl.tasks import load_task

out = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
torch.set_num_threads(2)
task = load_task("products")
by_id = {p.id: p for p in task.train}
rows = [{"prompt": p.prompt, "answer": p.answer, "problem_id": p.id} for p in list(task.train)[:64]]

def reward(completions, problem_id, **_):
    return [task.score(by_id[i], c[0]["content"]) for c, i in zip(completions, problem_id)]

args = CreditGRPOConfig(
    output_dir=out, use_cpu=True, bf16=False, report_to=[], save_strategy="no",
    per_device_train_batch_size=16, num_generations=8, max_completion_length=32,
    max_steps=steps, logging_steps=1, learning_rate=3e-5, seed=0, beta=0.0, temperature=1.0,
    estimator="gear", reference_column="answer", log_samples_per_step=4,
    gradient_checkpointing=(os.environ.get("GC", "1") == "1"))
model_dir = str(ensure_smollm2())
print("model folder:", model_dir)
t = time.time()
trainer = CreditGRPOTrainer(model=model_dir, reward_funcs=reward, args=args,
                            train_dataset=datasets.Dataset.from_list(rows))
trainer.train()
print(f"TRL run: {steps} steps in {time.time() - t:.0f} s")
