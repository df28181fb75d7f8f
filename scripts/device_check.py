"""Device check helpers for ``scripts/device_check.sh`` (gear-rl on one NVIDIA GPU).

Subcommands (the first is the default, so ``device_check.py --device cpu`` runs it):

- ``signals [--device cuda] [--ref-device cpu]``: check (b). Builds a tiny random Llama
  (:func:`gear_rl.models.tiny_random_model`) and a GRPO-shaped batch, runs the signal pass the
  trainer uses (:func:`gear_rl.signals.token_signals`: the no-grad scoring pass with the ``full``
  and ``k3`` divergences, and the update's gradient pass with shared prompts, layer
  checkpointing and a teacher-row subset) on both devices in fp32, and compares log-probs,
  entropy, divergence, the loss and every parameter gradient. Then runs the credit estimators
  that go through GEAR's numba kernel (``gear`` and its ablations) and GRPO / Dr.GRPO on the
  same inputs as tensors on each device and requires identical outputs. ``--device cpu``
  (compare cpu with cpu) is the dry run of this code path on a machine without a GPU.
- ``train-metrics RUN_DIR``: check (a)'s verdict on one ``gear-rl train`` run directory.
- ``verl-data DIR``: check (c)'s few rows of verl-layout parquet.
- ``verl-log LOG``: check (c)'s verdict from the verl job's console log.

Tolerances of ``signals`` (fp32 on both devices, TF32 off):

- log-probs, entropy, divergence: 1e-4 absolute (divergence: plus 1e-4 relative, since k3 =
  ``r - 1 - log r`` multiplies the log-ratio's error by ``r``). The same fp32 maths on two devices
  differs only by summation order (matmuls, log-sum-exp over the vocabulary): a few float32
  ulps of values of order ``log V`` (~5.6 here), about 1e-6. The run prints beside each
  difference the "fp32 scale": the same pass on the reference device with the model in fp64
  against fp32, the size of the rounding itself. Real faults are orders larger: a response
  shifted by one position, a lost mask or accidental bf16 compute (8 significant bits) move
  log-probs by 1e-2 or more.
- the update's loss: 1e-5 absolute; parameter gradients: ``max |g_dev - g_ref|`` at most 1e-4
  of ``max |g_ref|`` (gradients sum over every token of the batch, so their rounding grows with
  the batch; relative to the largest gradient it stays near 1e-6 here).
- credit: exact. GEAR's kernel runs on the CPU whatever the device: ``gear_rl.credit.gear``
  (``_run_kernel``) copies divergence, entropy, mask and the outcome advantages to contiguous CPU
  arrays, runs the numba kernel, and copies the ``[B, T]`` result back to ``mask``'s device. The
  outcome advantages (GRPO) are computed on the tensors' device in float64; with rewards in
  {0, 0.5, 1} every group sum is exact in any order, so the kernel sees the same bits on both
  devices and its output must be bit-identical.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SIGNAL_ATOL = 1e-4
DIVERGENCE_RTOL = 1e-4
LOSS_ATOL = 1e-5
GRAD_RTOL = 1e-4

# The rows of check (c)'s verl dataset: (question, answer); the first is the brief's example.
VERL_ROWS = (
    ("What is 3 * 4?", "12"), ("What is 2 * 5?", "10"), ("What is 6 * 7?", "42"),
    ("What is 9 * 3?", "27"), ("What is 8 * 8?", "64"), ("What is 5 * 4?", "20"),
    ("What is 7 * 6?", "42"), ("What is 4 * 9?", "36"),
)
VERL_DATA_SOURCE = "gear_rl/device_check"


class Report:
    """Collects PASS/FAIL lines; ``failed`` is True once any check failed."""

    def __init__(self) -> None:
        self.failed = False

    def line(self, ok: bool | None, name: str, detail: str) -> None:
        status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
        self.failed |= ok is False
        print(f"{status}  {name:<34} {detail}", flush=True)


# ---------------------------------------------------------------------------------------------
# (b) the signal pass and the credit kernel, device against reference device
# ---------------------------------------------------------------------------------------------
def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: Any, repeat: int = 3) -> tuple[Any, float]:
    """``fn()`` once as a warm-up, then its best of ``repeat`` timed runs in seconds."""
    result = fn()
    best = math.inf
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return result, best


def _max_diff(a: Any, b: Any) -> float:
    return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max())


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _batch(seed: int, groups: int, samples: int) -> dict[str, Any]:
    """A GRPO-shaped batch of token ids: ``groups`` prompts repeated ``samples`` times, teacher
    prompts (the prompt plus a hint of other lengths), responses of varied lengths, a few
    observation spans (mask 0), rewards in {0, 0.5, 1} mixed within most groups."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(0, 256, (n,), generator=gen).tolist()

    prompts, teachers, responses, masks, rewards, group_ids = [], [], [], [], [], []
    for g in range(groups):
        prompt = ids(int(torch.randint(6, 20, (1,), generator=gen)))
        teacher = prompt + ids(int(torch.randint(3, 12, (1,), generator=gen)))
        for s in range(samples):
            length = int(torch.randint(4, 48, (1,), generator=gen))
            keep = [1] * length
            if (g + s) % 5 == 0 and length > 12:  # a tool output in the middle of the response
                keep[5:9] = [0] * 4
            prompts.append(prompt)
            teachers.append(teacher)
            responses.append(ids(length))
            masks.append(keep)
            rewards.append(float(torch.randint(0, 3, (1,), generator=gen)) / 2)
            group_ids.append(g)
    return {"prompts": prompts, "teachers": teachers, "responses": responses, "masks": masks,
            "rewards": torch.tensor(rewards), "group_ids": torch.tensor(group_ids)}


def _model(device: str, dtype: Any) -> Any:
    from gear_rl.models import tiny_random_model

    # 4 layers, hidden 128, vocabulary 259 (byte-level); a larger init than the default gives
    # sharper next-token distributions, so entropy and divergence vary from token to token.
    return tiny_random_model("llama", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                             intermediate_size=256, initializer_range=0.1, seed=0, dtype=dtype,
                             device=device)


def _scoring(model: Any, data: dict[str, Any], estimator: str) -> Any:
    from gear_rl.signals import token_signals

    # chunk_size 64: several LM-head chunks per pass (the default would fit one here)
    return token_signals(model, data["prompts"], data["teachers"], data["responses"],
                         temperature=1.0, estimator=estimator, response_mask=data["masks"],
                         chunk_size=64)


def _update(model: Any, data: dict[str, Any], advantages: Any) -> tuple[float, dict[str, Any]]:
    """The update's forward and backward as the trainer runs them (``_signals`` with
    ``requires_grad``): shared prompts, checkpointed layers, entropy without gradient, the
    teacher on the rows with a non-zero advantage only. Returns the loss and the gradients."""
    from gear_rl.signals import token_signals

    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    adv = advantages.to(device)
    sig = token_signals(model, data["prompts"], data["teachers"], data["responses"],
                        temperature=1.0, estimator="full", response_mask=data["masks"],
                        chunk_size=64, student_requires_grad=True, share_prompts=True,
                        checkpoint_layers=True, entropy_requires_grad=False,
                        divergence_requires_grad=False, teacher_rows=(adv != 0).cpu())
    mask = sig.mask
    loss = -(sig.student_logprobs * adv[:, None] * mask).sum() / mask.sum()
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()
             if p.grad is not None}
    return float(loss.detach()), grads


def check_signals(args: argparse.Namespace) -> int:
    import torch

    device, ref = args.device, args.ref_device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print(f"device_check.py: --device {device} but torch {torch.__version__} sees no CUDA "
              "device (a CPU build, or no GPU); --device cpu is the dry run", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # compare fp32 with fp32, not TF32
    torch.backends.cudnn.allow_tf32 = False
    where = device
    if torch.device(device).type == "cuda":
        where = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    print(f"(b) signal pass and credit on {where} against {ref}: torch {torch.__version__}, "
          f"fp32, TF32 off, {torch.get_num_threads()} CPU threads", flush=True)
    report = Report()
    data = _batch(args.seed, args.groups, args.samples)

    # --- the signal pass: no-grad scoring, two divergence estimators
    model_ref, model_dev = _model(ref, torch.float32), _model(device, torch.float32)
    model_64 = _model(ref, torch.float64)
    signals_ref: dict[str, Any] = {}
    signals_dev: dict[str, Any] = {}
    for estimator in ("full", "k3"):
        out_ref, t_ref = _timed(lambda e=estimator: _scoring(model_ref, data, e), ref)
        out_dev, t_dev = _timed(lambda e=estimator: _scoring(model_dev, data, e), device)
        out_64 = _scoring(model_64, data, estimator)
        signals_ref[estimator], signals_dev[estimator] = out_ref, out_dev
        if not torch.equal(out_ref.mask.cpu(), out_dev.mask.cpu()):
            report.line(False, f"signals/{estimator} scoring", "masks differ")
            continue
        parts, ok = [], True
        for field, label in (("student_logprobs", "logp"), ("teacher_logprobs", "teacher logp"),
                             ("entropy", "entropy"), ("divergence", "div")):
            a, b = getattr(out_dev, field), getattr(out_ref, field)
            diff, scale = _max_diff(a, b), _max_diff(getattr(out_64, field), b)
            tol = SIGNAL_ATOL
            if field == "divergence":
                tol += DIVERGENCE_RTOL * float(b.detach().abs().max())
            ok &= diff <= tol and a.device.type == torch.device(device).type
            parts.append(f"{label} {_fmt(diff)} (tol {_fmt(tol)}, fp32 scale {_fmt(scale)})")
        report.line(ok, f"signals/{estimator} scoring, no grad",
                    f"max|diff| {'; '.join(parts)}; {ref} {t_ref * 1e3:.1f} ms, "
                    f"{device} {t_dev * 1e3:.1f} ms")

    # --- the update's gradient pass
    from gear_rl.credit import grpo_advantages

    advantages = grpo_advantages(data["rewards"], data["group_ids"])
    (loss_ref, grads_ref), t_ref = _timed(lambda: _update(model_ref, data, advantages), ref, 1)
    (loss_dev, grads_dev), t_dev = _timed(lambda: _update(model_dev, data, advantages), device, 1)
    scale = max(float(g.abs().max()) for g in grads_ref.values())
    worst = max(_max_diff(grads_dev[name], g) for name, g in grads_ref.items())
    ok = (set(grads_ref) == set(grads_dev) and abs(loss_dev - loss_ref) <= LOSS_ATOL
          and worst <= GRAD_RTOL * scale)
    report.line(ok, "signals/full update, grad",
                f"loss {loss_ref:+.6f} vs {loss_dev:+.6f} (diff {_fmt(abs(loss_dev - loss_ref))}, "
                f"tol {_fmt(LOSS_ATOL)}); grads max|diff| {_fmt(worst)} of max|g| {scale:.2e} "
                f"(tol {_fmt(GRAD_RTOL * scale)}), {len(grads_ref)} tensors; "
                f"{ref} {t_ref * 1e3:.1f} ms, {device} {t_dev * 1e3:.1f} ms")

    # --- the credit estimators, same inputs on both devices
    _check_credit(report, data, signals_ref, signals_dev, device, ref, args.seed)
    print(f"(b) {'FAIL' if report.failed else 'PASS'}", flush=True)
    return 1 if report.failed else 0


def _credit_inputs(data: dict[str, Any], signals: Any) -> dict[str, Any]:
    return {"rewards": data["rewards"], "group_ids": data["group_ids"], "mask": signals.mask,
            "divergence": signals.divergence, "entropy": signals.entropy,
            "student_logprobs": signals.student_logprobs,
            "teacher_logprobs": signals.teacher_logprobs}


def _large_inputs(seed: int, groups: int = 64, samples: int = 8, length: int = 1024) -> dict:
    """A random batch of training size for the kernel: 512 rows x 1024 tokens."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    rows = groups * samples
    lengths = torch.randint(16, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    student = -torch.rand(rows, length, generator=gen) * 4 * mask
    return {"rewards": torch.randint(0, 3, (rows,), generator=gen).float() / 2,
            "group_ids": torch.arange(groups).repeat_interleave(samples), "mask": mask,
            "divergence": torch.randn(rows, length, generator=gen).exp() * mask,
            "entropy": torch.rand(rows, length, generator=gen) * 3 * mask,
            "student_logprobs": student,
            "teacher_logprobs": student + torch.randn(rows, length, generator=gen) * mask}


def _credit_names() -> list[str]:
    from gear_rl.credit import estimator_names, get_estimator

    names = [name for name in estimator_names(step_level=False) if get_estimator(name).segments]
    return ["grpo", "dr_grpo", *sorted(names)]


def _check_credit(report: Report, data: dict[str, Any], signals_ref: dict[str, Any],
                  signals_dev: dict[str, Any], device: str, ref: str, seed: int) -> None:
    import torch

    from gear_rl.credit import CreditBatch, get_estimator

    def batch(inputs: dict[str, Any], on: str) -> CreditBatch:
        return CreditBatch(**{k: v.to(on) for k, v in inputs.items()})

    start = time.perf_counter()
    get_estimator("gear")(batch(_credit_inputs(data, signals_ref["full"]), ref))
    report.line(None, "credit/gear first call",
                f"{time.perf_counter() - start:.2f} s (numba compile or cache load); the kernel "
                "runs on CPU numpy: inputs copied to host, result copied back to mask's device")
    cases = {"small": _credit_inputs(data, signals_ref["full"]), "large": _large_inputs(seed)}
    for name in _credit_names():
        estimator = get_estimator(name)
        parts, ok = [], True
        for case, inputs in cases.items():
            try:
                out_ref, t_ref = _timed(lambda e=estimator, i=inputs: e(batch(i, ref)), ref)
            except ValueError as exc:  # an estimator this batch cannot feed
                parts.append(f"{case}: not run ({exc})")
                continue
            out_dev, t_dev = _timed(lambda e=estimator, i=inputs: e(batch(i, device)), device)
            same = torch.equal(out_dev.cpu(), out_ref.cpu())
            on_device = out_dev.device.type == torch.device(device).type
            ok &= same and on_device
            rows, length = inputs["mask"].shape
            parts.append(f"{case} {rows}x{length}: {'identical' if same else 'DIFFERENT'} "
                         f"(max|diff| {_fmt(_max_diff(out_dev, out_ref))}"
                         f"{'' if on_device else f', output on {out_dev.device}'}), "
                         f"{ref} {t_ref * 1e3:.2f} ms, {device} {t_dev * 1e3:.2f} ms")
        report.line(ok, f"credit/{name}", "; ".join(parts))

    # End to end, for information: GEAR on each device's own signals. Its onsets compare a
    # normalised divergence with lambda_kl, so a rounding-size difference at a threshold can
    # move a segment: not a fault, hence not a check.
    gear = get_estimator("gear")
    a = gear(batch(_credit_inputs(data, signals_ref["full"]), ref))
    b = gear(batch(_credit_inputs(data, signals_dev["full"]), device))
    differing = int((a.cpu() != b.cpu()).sum())
    report.line(None, "credit/gear on each device's signals",
                f"max|diff| {_fmt(_max_diff(a, b))}, {differing} of {int(a.numel())} tokens differ")


# ---------------------------------------------------------------------------------------------
# (a) verdict on a gear-rl train run
# ---------------------------------------------------------------------------------------------
def _finite_numbers(record: dict[str, Any]) -> list[str]:
    """Keys of ``record`` whose number is NaN or infinite."""
    return [k for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)]


def train_metrics(args: argparse.Namespace) -> int:
    run = Path(args.run_dir)
    label = args.label or run.name
    problems: list[str] = []
    try:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                   if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"FAIL  {label}: no readable metrics.jsonl ({exc})")
        return 1
    steps = [r for r in records if r.get("time/step") is not None]
    numbers = sorted({r.get("step") for r in steps})
    if numbers != list(range(1, args.steps + 1)):
        problems.append(f"steps logged {numbers}, expected 1..{args.steps}")
    bad = sorted({f"step {r.get('step')}: {k}" for r in records for k in _finite_numbers(r)})
    if bad:
        problems.append("non-finite metrics: " + ", ".join(bad[:8]))
    try:
        info = json.loads((run / "run.json").read_text())
    except (OSError, ValueError):
        info = {}
    if args.expect_device and not str(info.get("device", "")).startswith(args.expect_device):
        problems.append(f"ran on {info.get('device')!r}, expected {args.expect_device}")
    if args.expect_bf16 and info.get("autocast_bf16") is not True:
        problems.append("bf16 autocast was off")
    times = [float(r["time/step"]) for r in steps]
    detail = []
    if args.wall is not None:
        detail.append(f"wall {args.wall:.1f} s")
    if times:
        detail.append(f"{sum(times) / len(times):.2f} s/step mean")
        if len(times) > 1:
            later = times[1:]
            detail.append(f"{sum(later) / len(later):.2f} s/step after step 1 "
                          f"(step 1 {times[0]:.2f} s)")
    evals = [r for r in records if any(k.startswith("eval/mean@") for k in r)]
    if evals:
        key = next(k for k in evals[0] if k.startswith("eval/mean@"))
        detail.append(f"{key[5:]} {evals[0][key]:.3f} -> {evals[-1].get(key, float('nan')):.3f}")
    peaks = [r["memory/cuda_peak_gb"] for r in steps if "memory/cuda_peak_gb" in r]
    if peaks:
        detail.append(f"CUDA peak {max(peaks):.2f} GB")
    detail.append(f"device {info.get('device')}, bf16 autocast {info.get('autocast_bf16')}, "
                  f"sampler {info.get('sampler_dtype')}")
    if problems:
        print(f"FAIL  {label}: {'; '.join(problems)} ({', '.join(detail)})")
        return 1
    print(f"PASS  {label}: {', '.join(detail)}")
    return 0


# ---------------------------------------------------------------------------------------------
# (c) the verl job's data and its verdict
# ---------------------------------------------------------------------------------------------
def verl_data(args: argparse.Namespace) -> int:
    """``train.parquet`` and ``test.parquet`` in verl's layout (chat ``prompt``,
    ``reward_model.ground_truth``, ``data_source``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"data_source": VERL_DATA_SOURCE,
             "prompt": [{"role": "user", "content": question}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": answer},
             "extra_info": {"index": index, "split": "train"}}
            for index, (question, answer) in enumerate(VERL_ROWS)]
    for split in ("train", "test"):
        for row in rows:
            row["extra_info"] = {**row["extra_info"], "split": split}
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    print(f"wrote {len(rows)} rows each to {out / 'train.parquet'} and {out / 'test.parquet'}")
    return 0


def verl_log(args: argparse.Namespace) -> int:
    """PASS if the console log holds metric lines for steps 1..N, each with finite ``gear/``
    metrics; prints s/step (``timing_s/step``) and a few GEAR diagnostics."""
    try:
        text = Path(args.log).read_text(errors="replace")
    except OSError as exc:
        print(f"FAIL  {args.label}: no log ({exc})")
        return 1
    from gear_rl.integrations.verl.cpu_job import console_metrics

    steps = console_metrics(text)
    problems = []
    if sorted(steps) != list(range(1, args.steps + 1)):
        problems.append(f"metric lines for steps {sorted(steps)}, expected 1..{args.steps}")
    gear_keys = sorted({k for f in steps.values() for k in f if k.startswith("gear/")})
    if not gear_keys:
        problems.append("no gear/ metrics in the console output")
    bad = []
    for step, fields in steps.items():
        for key in gear_keys:
            if not math.isfinite(fields.get(key, math.nan)):
                bad.append(f"step {step} {key}={fields.get(key)}")
    if bad:
        problems.append("non-finite or missing: " + ", ".join(bad[:6]))
    times = [f["timing_s/step"] for f in steps.values() if "timing_s/step" in f]
    detail = [f"{len(gear_keys)} gear/ metrics"]
    if times:
        detail.append(f"{sum(times) / len(times):.2f} s/step mean (timing_s/step: "
                      + ", ".join(f"{t:.2f}" for t in times) + ")")
    last = steps[max(steps)] if steps else {}
    for key in ("gear/weight_mean_pos", "gear/weight_mean_neg", "gear/segment_frac",
                "critic/score/mean", "timing_s/gear_teacher"):
        if key in last:
            detail.append(f"{key} {last[key]}")
    if problems:
        print(f"FAIL  {args.label}: {'; '.join(problems)} ({', '.join(detail)})")
        return 1
    print(f"PASS  {args.label}: {', '.join(detail)}")
    return 0


# ---------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("signals", help="(b): signal pass and credit, device vs reference")
    p.add_argument("--device", default="cuda", help="device under test (cpu: dry run)")
    p.add_argument("--ref-device", default="cpu", help="reference device")
    p.add_argument("--groups", type=int, default=4, help="prompts in the batch")
    p.add_argument("--samples", type=int, default=4, help="responses per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=check_signals)

    p = sub.add_parser("train-metrics", help="(a): verdict on a gear-rl train run directory")
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--label", default=None)
    p.add_argument("--wall", type=float, default=None, help="the run's wall time in seconds")
    p.add_argument("--expect-device", default=None, help="e.g. cuda")
    p.add_argument("--expect-bf16", action="store_true")
    p.set_defaults(fn=train_metrics)

    p = sub.add_parser("verl-data", help="(c): write the verl-layout parquet files")
    p.add_argument("dir")
    p.set_defaults(fn=verl_data)

    p = sub.add_parser("verl-log", help="(c): verdict from the verl job's console log")
    p.add_argument("log")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--label", default="(c) verl main_ppo")
    p.set_defaults(fn=verl_log)


    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        args_list = ["signals", *args_list]
    args = parser.parse_args(args_list)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
