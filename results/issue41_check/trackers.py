"""Read back what each tracker stored for runs/default and compare with metrics.jsonl."""
import glob, json, os, sqlite3, sys
run = sys.argv[1]; trackio_dir = sys.argv[2]
jsonl = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
ref = {}
for r in jsonl:
    for k, v in r.items():
        if k != "step" and isinstance(v, (int, float)):
            ref[(k, r["step"])] = v
ref_names = sorted({k for k, _ in ref})
print("metrics.jsonl:", len(jsonl), "records,", len(ref_names), "names")

# --- TensorBoard
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(f"{run}/tensorboard", size_guidance={"scalars": 0}); ea.Reload()
tb = {(tag, e.step): e.value for tag in ea.Tags()["scalars"] for e in ea.Scalars(tag)}
tb_names = sorted(ea.Tags()["scalars"])
print("\nTensorBoard tags:", len(tb_names))
print("  only in jsonl:", sorted(set(ref_names) - set(tb_names)))
print("  only in TB:", sorted(set(tb_names) - set(ref_names)))

# --- W&B offline: the run file (.wandb, a LevelDB-style record log) via wandb's own reader
wb = {}
wdir = glob.glob(f"{run}/wandb/offline-run-*")
print("\nW&B folders:", wdir)
files = glob.glob(f"{wdir[0]}/*.wandb")
from wandb.sdk.internal import datastore
from wandb.proto import wandb_internal_pb2 as pb
ds = datastore.DataStore(); ds.open_for_scan(files[0])
history_steps = 0; summary = {}; config_keys = []
while True:
    data = ds.scan_data()
    if data is None: break
    rec = pb.Record(); rec.ParseFromString(data)
    kind = rec.WhichOneof("record_type")
    if kind == "history":
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
        history_steps += 1
        step = items.get("_step")
        for k, v in items.items():
            if not k.startswith("_") and isinstance(v, (int, float)):
                wb[(k, step)] = v
    elif kind == "summary":
        for i in rec.summary.update:
            summary[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    elif kind == "config":
        config_keys += [i.key for i in rec.config.update]
    elif kind == "run":
        print("  run:", rec.run.run_id, "name:", rec.run.display_name, "project:", rec.run.project)
wb_names = sorted({k for k, _ in wb})
print("  history rows:", history_steps, "names:", len(wb_names), "config keys:", len(config_keys), config_keys[:8])
print("  only in jsonl:", sorted(set(ref_names) - set(wb_names)))
print("  only in W&B:", sorted(set(wb_names) - set(ref_names)))

# --- trackio: its SQLite store
db = glob.glob(f"{trackio_dir}/*.db")
print("\ntrackio stores:", db)
con = sqlite3.connect(db[0])
tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
print("  tables:", tables)
for t in tables:
    cols = [r[1] for r in con.execute(f"pragma table_info({t})")]
    print("   ", t, cols, con.execute(f"select count(*) from {t}").fetchone())
tk = {}
rows = con.execute("select run_name, step, metrics from metrics").fetchall()
for name, step, m in rows:
    for k, v in json.loads(m).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            tk[(k, step)] = v
tk_names = sorted({k for k, _ in tk})
print("  runs:", sorted({r[0] for r in rows}), "names:", len(tk_names))
print("  only in jsonl:", sorted(set(ref_names) - set(tk_names)))
print("  only in trackio:", sorted(set(tk_names) - set(ref_names)))

# --- value agreement
def cmp(store, name):
    worst, missing = 0.0, 0
    for key, v in ref.items():
        if key not in store: missing += 1; continue
        worst = max(worst, abs(store[key] - v) / max(1e-12, abs(v)))
    print(f"  {name}: {len(ref)-missing}/{len(ref)} (name, step) values present, max rel diff {worst:.2e}")
print("\nagreement with metrics.jsonl:")
cmp(tb, "TensorBoard (float32)"); cmp(wb, "W&B"); cmp(tk, "trackio")
last = max(r["step"] for r in jsonl)
print("\n| metric | step | metrics.jsonl | TensorBoard | W&B | trackio |\n|---|---|---|---|---|---|")
for k, s in [("reward_mean", 1), ("reward_mean", last), ("eval/mean@4", 0), ("eval/mean@4", last),
             ("eval/pass@4", last), ("loss", last), ("time/step", last)]:
    f = lambda d: ("%.6g" % d[(k, s)]) if (k, s) in d else "missing"
    print(f"| {k} | {s} | {f(ref)} | {f(tb)} | {f(wb)} | {f(tk)} |")
print("\nW&B summary (final values):", {k: summary[k] for k in list(summary)[:0]} or "")
for k in ["reward_mean", "eval/mean@4", "eval/pass@4", "loss", "_step"]:
    print("  summary", k, summary.get(k))
