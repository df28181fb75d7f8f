import os, sys, time, json
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
out = sys.argv[1]
t = time.time()
tok = AutoTokenizer.from_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(out)
print("transformers", transformers.__version__, "torch", torch.__version__)
print("loaded in %.1fs" % (time.time() - t), type(model).__name__, "dtype", model.dtype,
      "params", sum(p.numel() for p in model.parameters()))
print("eos", tok.eos_token, tok.eos_token_id, "pad", tok.pad_token, "gen_config eos", model.generation_config.eos_token_id)
msgs = [{"role": "user", "content": "What is 7 * 8? Give the final answer as \\boxed{}."}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
print("prompt text:", repr(tok.decode(ids["input_ids"][0])))
with torch.no_grad():
    gen = model.generate(**ids, max_new_tokens=40, do_sample=False)
print("greedy completion:", repr(tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=False)))
