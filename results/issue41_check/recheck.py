import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d = "/root/.cache/gear-rl/smollm2-135m-instruct-q4_1-0.1.2-98362432-f1"
tok = AutoTokenizer.from_pretrained(d); model = AutoModelForCausalLM.from_pretrained(d).eval()
for line in list(open(sys.argv[1]))[:int(sys.argv[2])]:
    r = json.loads(line)
    if r["step"] != 1: continue
    p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + r["token_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(p) - 1:-1].float()
    lp = torch.log_softmax(logits, -1)
    tlp = lp.gather(1, torch.tensor(r["token_ids"])[:, None])[:, 0]
    ent = -(lp.exp() * lp).sum(-1)
    m = torch.tensor(r["mask"]).bool()
    print("row", r["row"], "n", len(p), "+", len(r["token_ids"]))
    print("  logged student lp", [round(x, 2) for x in r["student_logprobs"][:8]])
    print("  recomputed     lp", [round(x, 2) for x in tlp[:8].tolist()])
    print("  logged entropy", [round(x, 2) for x in r["entropy"][:8]], "mean", round(sum(e for e, k in zip(r["entropy"], r["mask"]) if k) / m.sum().item(), 3))
    print("  recomputed ent", [round(x, 2) for x in ent[:8].tolist()], "mean", round(ent[m].mean().item(), 3))
