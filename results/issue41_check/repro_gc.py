"""gear_rl.signals.response_logprobs on a model with HF gradient checkpointing on and in train
mode (what TRL's GRPOTrainer hands the credit pass) vs the same model in eval mode."""
import torch
from gear_rl.models import load_policy
from gear_rl.signals import response_logprobs, prompt_ids
torch.manual_seed(0)
model, tok = load_policy("smollm2-135m")
p = prompt_ids(tok, [{"role": "user", "content": "Solve the following multiplication: 8 * 7."}])
r = tok("The answer is 56.", add_special_tokens=False)["input_ids"]
def run(label, **kw):
    with torch.no_grad():
        s = response_logprobs(model, [p, p], [r, r[:3]], **kw)
    print(f"{label:42s} lp {[round(x, 2) for x in s.logprobs[0, :6].tolist()]} ent {[round(x, 2) for x in s.entropy[0, :6].tolist()]}")
model.eval(); run("eval mode")
model.gradient_checkpointing_enable(); model.train(); run("train + gradient_checkpointing")
run("train + gradient_checkpointing, share_prompts=False", share_prompts=False)
model.gradient_checkpointing_disable(); run("train, no gradient_checkpointing")
