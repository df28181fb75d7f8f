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
                  signals_dev: dict[str, Any], device: str, ref: str, seed: int,
                  large: tuple[int, int, int] = (64, 8, 1024), prefix: str = "") -> None:
    """Every segment estimator and GRPO / Dr.GRPO on the same inputs on ``device`` and ``ref``:
    outputs must be identical. ``large``: (groups, samples, length) of the random batch."""
    import torch

    from gear_rl.credit import CreditBatch, get_estimator

    def batch(inputs: dict[str, Any], on: str) -> CreditBatch:
        return CreditBatch(**{k: v.to(on) for k, v in inputs.items()})

    start = time.perf_counter()
    get_estimator("gear")(batch(_credit_inputs(data, signals_ref["full"]), ref))
    report.line(None, f"{prefix}credit/gear first call",
                f"{time.perf_counter() - start:.2f} s (numba compile or cache load); the kernel "
                "runs on CPU numpy: inputs copied to host, result copied back to mask's device")
    cases = {"small": _credit_inputs(data, signals_ref["full"]),
             "large": _large_inputs(seed, *large)}
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
        report.line(ok, f"{prefix}credit/{name}", "; ".join(parts))

    # End to end, for information: GEAR on each device's own signals. Its onsets compare a
    # normalised divergence with lambda_kl, so a rounding-size difference at a threshold can
    # move a segment: not a fault, hence not a check.
    gear = get_estimator("gear")
    a = gear(batch(_credit_inputs(data, signals_ref["full"]), ref))
    b = gear(batch(_credit_inputs(data, signals_dev["full"]), device))
    differing = int((a.cpu() != b.cpu()).sum())
    report.line(None, f"{prefix}credit/gear on each device's signals",
                f"max|diff| {_fmt(_max_diff(a, b))}, {differing} of {int(a.numel())} tokens differ")


# ---------------------------------------------------------------------------------------------
# (a) verdict on a gear-rl train run
# ---------------------------------------------------------------------------------------------
def _finite_numbers(record: dict[str, Any]) -> list[str]:
    """Keys of ``record`` whose number is NaN or infinite."""
    return [k for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)]


PHASES = ("rollout", "signals", "values", "credit", "update", "step")
"""The phases a ``gear-rl train`` step times (``time/<phase>`` in metrics.jsonl)."""


def train_verdict(run_dir: str | Path, steps: int, *, expect_device: str | None = None,
                  expect_bf16: bool = False, wall: float | None = None,
                  ) -> tuple[bool, str, list[dict[str, Any]]]:
    """Check (a)'s verdict on one ``gear-rl train`` run directory: steps 1..``steps`` logged,
    every number finite, every phase of :data:`PHASES` timed in every step, the device and bf16
    autocast as expected. Returns (passed, detail, the step records)."""
    run = Path(run_dir)
    problems: list[str] = []
    try:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                   if line.strip()]
    except (OSError, ValueError) as exc:
        return False, f"no readable metrics.jsonl ({exc})", []
    steps_logged = [r for r in records if r.get("time/step") is not None]
    numbers = sorted({r.get("step") for r in steps_logged})
    if numbers != list(range(1, steps + 1)):
        problems.append(f"steps logged {numbers}, expected 1..{steps}")
    bad = sorted({f"step {r.get('step')}: {k}" for r in records for k in _finite_numbers(r)})
    if bad:
        problems.append("non-finite metrics: " + ", ".join(bad[:8]))
    untimed = sorted({f"step {r.get('step')}: time/{p}" for r in steps_logged for p in PHASES
                      if not isinstance(r.get(f"time/{p}"), (int, float))})
    if untimed:
        problems.append("phases not timed: " + ", ".join(untimed[:8]))
    try:
        info = json.loads((run / "run.json").read_text())
    except (OSError, ValueError):
        info = {}
    if expect_device and not str(info.get("device", "")).startswith(expect_device):
        problems.append(f"ran on {info.get('device')!r}, expected {expect_device}")
    if expect_bf16 and info.get("autocast_bf16") is not True:
        problems.append("bf16 autocast was off")
    times = [float(r["time/step"]) for r in steps_logged]
    detail = []
    if wall is not None:
        detail.append(f"wall {wall:.1f} s")
    if times:
        detail.append(f"{sum(times) / len(times):.2f} s/step mean")
        if len(times) > 1:
            later = times[1:]
            detail.append(f"{sum(later) / len(later):.2f} s/step after step 1 "
                          f"(step 1 {times[0]:.2f} s)")
        last = steps_logged[-1]
        detail.append("last step " + " ".join(
            f"{p} {float(last[f'time/{p}']):.2f}" for p in PHASES[:-1]
            if isinstance(last.get(f"time/{p}"), (int, float))))
    evals = [r for r in records if any(k.startswith("eval/mean@") for k in r)]
    if evals:
        key = next(k for k in evals[0] if k.startswith("eval/mean@"))
        detail.append(f"{key[5:]} {evals[0][key]:.3f} -> {evals[-1].get(key, float('nan')):.3f}")
    peaks = [r["memory/cuda_peak_gb"] for r in steps_logged if "memory/cuda_peak_gb" in r]
    if peaks:
        detail.append(f"CUDA peak {max(peaks):.2f} GB")
    detail.append(f"device {info.get('device')}, bf16 autocast {info.get('autocast_bf16')}, "
                  f"sampler {info.get('sampler_dtype')}")
    text = "; ".join(problems) + f" ({', '.join(detail)})" if problems else ", ".join(detail)
    return not problems, text, steps_logged


def train_metrics(args: argparse.Namespace) -> int:
    label = args.label or Path(args.run_dir).name
    ok, detail, _ = train_verdict(args.run_dir, args.steps, expect_device=args.expect_device,
                                  expect_bf16=args.expect_bf16, wall=args.wall)
    print(f"{'PASS' if ok else 'FAIL'}  {label}: {detail}")
    return 0 if ok else 1


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
# the lent machine's check: a, b, c with no weights and no network (scripts/device_check.sh)
# ---------------------------------------------------------------------------------------------
BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4}
"""Dense bf16 peak (TFLOP/s, no sparsity) of the SXM parts the lent machines are, for MFU."""


def _lent_sizes(quick: bool) -> dict[str, Any]:
    """The check's sizes on the GPU, and scaled down for the CPU rehearsal (``quick``)."""
    if quick:
        return {"layers": 2, "train": ["rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
                                       "rollout.max_new_tokens=8", "eval.size=2", "eval.k=1",
                                       "eval.max_new_tokens=8", "agent.max_turns=2",
                                       "agent.max_new_tokens_per_turn=8", "eval.at_start=false"],
                "steps": 1, "signal_lengths": [64, 192], "credit_large": (8, 4, 256),
                "paper": (4, 2, 32, 64), "paper_overrides": []}
    return {"layers": SMOLLM2_LAYERS, "train": ["eval.size=8", "eval.k=1", "agent.max_turns=3"],
            "steps": 3, "signal_lengths": [512, 1024, 2048, 3936], "credit_large": (128, 8, 4096),
            "paper": (128, 8, 1024, 2048),
            # ~10 rows of 1-2k tokens per micro-batch (the default 2048 would run ~1000)
            "paper_overrides": ["loss.micro_batch_tokens=16384"]}


SMOLLM2_LAYERS = 30


def default_rows(quick: bool) -> int:
    """Rows of one step of (a)'s runs: the rollout defaults unless ``quick`` sets them."""
    from gear_rl.train.config import RolloutConfig

    if quick:
        return 2 * 2
    return RolloutConfig().prompts_per_step * RolloutConfig().samples_per_prompt


def write_smollm2_shaped(path: Path, layers: int, seed: int = 0) -> Path:
    """A Hugging Face directory holding a model of SmolLM2-135M's shape
    (:data:`gear_rl.models.SMOLLM2_135M_SHAPE`, ``layers`` decoder layers) with random weights
    and the byte-level test tokenizer (259 of the 49,152 ids decode; the rest decode to nothing,
    which a random policy's samples mostly are). Built in place: no weights travel."""
    from gear_rl.models import SMOLLM2_135M_SHAPE, build_tiny_tokenizer, tiny_random_model

    model = tiny_random_model("llama", **{**SMOLLM2_135M_SHAPE, "num_layers": layers}, seed=seed)
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path


def _train_cases(model_name: str, quick: bool) -> list[tuple[str, list[str]]]:
    """(label, overrides) of check (a)'s runs on one model: GEAR, GRPO, a Monte-Carlo estimator
    and a step-level one on an environment. ``quick`` (the CPU rehearsal, where a step of the
    SmolLM2-shaped model takes 15-35 s): GEAR and GRPO on it, the other two on the tiny model."""
    cases = [("gear", ["estimator=gear"]), ("grpo", ["estimator=grpo"]),
             ("vineppo", ["estimator=vineppo", "credit.mc_samples=2"]),
             ("gigpo on sokoban", ["estimator=gigpo", "task=sokoban"])]
    if quick:
        return cases[:2] if model_name == "smollm2-shaped" else cases[2:]
    return cases


def _run_train(overrides: list[str]) -> tuple[int, float, str]:
    """``gear-rl train`` in this process; (exit code, wall seconds, the error if it raised)."""
    from gear_rl.cli import main as cli_main

    start = time.perf_counter()
    try:
        code, error = int(cli_main(["train", *overrides]) or 0), ""
    except Exception as exc:  # a crash is this check's FAIL, not the whole check's end
        code, error = 1, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return code, time.perf_counter() - start, error


def _flops_per_step(n_matmul: int, layers: int, hidden: int, lengths: Sequence[int]) -> float:
    """Model FLOPs of one training pass (forward + backward) over rows of ``lengths`` tokens:
    ``6 N`` per token (``N``: the parameters of the matrix products, LM head included, the input
    embedding not) plus causal attention, ``6 L d n^2`` per row of ``n`` tokens (scores and
    values, each ``2 L d n^2 / 2`` forward, times 3 with the backward). Extra passes a method
    runs (the scoring pass, GEAR's teacher) are not model FLOPs: they show as lower MFU."""
    tokens = sum(lengths)
    return 6.0 * n_matmul * tokens + 6.0 * layers * hidden * sum(n * n for n in lengths)


def _matmul_params(model: Any) -> int:
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight
    # tied: the embedding's one tensor is the LM head's matrix product
    return total if head is embedding else total - embedding.numel()


def _mfu(flops: float, seconds: float, device: str) -> str:
    import torch

    rate = flops / max(seconds, 1e-9) / 1e12  # TFLOP/s
    peak = None
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
        peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    return f"{rate:.3g} TFLOP/s" + (f", MFU {100 * rate / peak:.1f}% of {peak:g}"
                                    if peak else " (MFU: no bf16 peak known for this device)")


def lent_train(report: Report, out: Path, device: str, quick: bool, model_dirs: dict[str, Path],
               numbers: dict[str, Any]) -> None:
    """(a): ``gear-rl train`` on ``device`` in bf16, each estimator of :func:`_train_cases` on
    each model, then the credit kernel on the model's own signals, device against CPU."""
    import torch

    sizes = _lent_sizes(quick)
    for model_name, model_path in model_dirs.items():
        for label, extra in _train_cases(model_name, quick):
            run_dir = out / f"train-{model_name}-{label.split()[0]}"
            steps = sizes["steps"] if label in ("gear", "grpo") else max(1, sizes["steps"] - 1)
            overrides = [f"model={model_path}", f"steps={steps}", "seed=0", f"device={device}",
                         "precision=bf16", "log.report_to=none", "log.progress=false",
                         f"out={run_dir}", *sizes["train"], *extra]
            code, wall, error = _run_train(overrides)
            name = f"(a) train {model_name} {label}"
            if code != 0:
                report.line(False, name, f"exit {code} after {wall:.1f} s {error}".strip())
                continue
            ok, detail, records = train_verdict(run_dir, steps, expect_device=device.split(":")[0],
                                                expect_bf16=True, wall=wall)
            report.line(ok, name, detail)
            if ok and model_name == "smollm2-shaped" and label in ("gear", "grpo"):
                numbers[f"default/{label}"] = records
        # the credit on this model's signals: the same inputs on the device and on the CPU
        from gear_rl.models import load_policy

        model, _ = load_policy(str(model_path), device=device)
        data = _batch(0, 4, 4)
        signals = {"full": _scoring(model, data, "full")}
        _check_credit(report, data, signals, signals, device, "cpu", 0,
                      large=sizes["credit_large"], prefix=f"(a) {model_name} ")
        del model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


def lent_signals(report: Report, device: str, quick: bool) -> None:
    """(b) at scale: the signal pass on a model of SmolLM2's vocabulary and width (2 layers:
    the LM head and the full-vocabulary softmax maths are what (b) checks) at response lengths
    up to 4k tokens, ``full`` KL, ``topk`` and ``k3`` with entropy, device against CPU (fp32,
    TF32 off), with the device's peak memory for each pass."""
    import torch

    from gear_rl.models import SMOLLM2_135M_SHAPE, tiny_random_model
    from gear_rl.signals import token_signals

    torch.backends.cuda.matmul.allow_tf32 = False
    shape = {**SMOLLM2_135M_SHAPE, "num_layers": 2, "initializer_range": 0.1}
    models = {d: tiny_random_model("llama", **shape, seed=0, device=d) for d in (device, "cpu")}
    gen = torch.Generator().manual_seed(3)
    vocab = SMOLLM2_135M_SHAPE["vocab_size"]
    lengths = _lent_sizes(quick)["signal_lengths"]
    prompts = [torch.randint(0, vocab, (64,), generator=gen).tolist() for _ in lengths]
    teachers = [p + torch.randint(0, vocab, (32,), generator=gen).tolist() for p in prompts]
    responses = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    for kind, topk in (("full", None), ("topk", 20), ("k3", None)):
        outs, parts = {}, []
        for d in (device, "cpu"):
            cuda = torch.device(d).type == "cuda"
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            start = time.perf_counter()
            with torch.no_grad():
                outs[d] = token_signals(models[d], prompts, teachers, responses, estimator=kind,
                                        topk=topk)
            _sync(d)
            seconds = time.perf_counter() - start
            peak = (f", peak {(torch.cuda.max_memory_allocated() - base) / 2**30:.2f} GiB over "
                    "the model" if cuda else "")
            parts.append(f"{d} {seconds:.2f} s{peak}")
        a, b = outs[device], outs["cpu"]
        diffs = {f: _max_diff(getattr(a, f), getattr(b, f))
                 for f in ("student_logprobs", "entropy", "divergence")}
        tol = SIGNAL_ATOL + DIVERGENCE_RTOL * float(b.divergence.abs().max())
        ok = (diffs["student_logprobs"] <= SIGNAL_ATOL and diffs["entropy"] <= SIGNAL_ATOL
              and diffs["divergence"] <= tol and bool(torch.isfinite(a.divergence).all()))
        report.line(ok, f"(b) signals/{kind} V={vocab} up to {max(lengths)} tokens",
                    f"max|diff| logp {_fmt(diffs['student_logprobs'])}, entropy "
                    f"{_fmt(diffs['entropy'])} (tol {_fmt(SIGNAL_ATOL)}), div "
                    f"{_fmt(diffs['divergence'])} (tol {_fmt(tol)}); {'; '.join(parts)}")


def _synthetic_batch(trainer: Any, lengths: tuple[int, int], seed: int) -> Any:
    """The trainer's own rollout of one new token per row, its responses then replaced by random
    ones of ``lengths[0]..lengths[1]`` tokens and its rewards by random 0/1 (a paper-like batch
    without sampling thousands of tokens from a random model)."""
    import dataclasses

    import torch

    batch = trainer.rollout(1)
    gen = torch.Generator().manual_seed(seed)
    vocab = int(trainer.model.config.vocab_size)
    rows = len(batch.response_ids)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (rows,), generator=gen).tolist()
    responses = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in sizes]
    rewards = torch.randint(0, 2, (rows,), generator=gen).float()
    return dataclasses.replace(batch, response_ids=responses, finished=[True] * rows,
                               texts=[""] * rows, rewards=rewards)


def lent_numbers(report: Report, out: Path, device: str, quick: bool, model_dir: Path,
                 numbers: dict[str, Any]) -> None:
    """(c): step time and MFU of the SmolLM2-shaped model, GEAR against GRPO: at the default
    budget (from (a)'s runs) and on one paper-like batch (128 prompts x 8 samples of 1-2k
    tokens; chunked signal pass, micro-batched update), scored, credited and trained on by a
    GEAR trainer and a GRPO trainer in turn."""
    import torch

    from gear_rl.models import load_policy
    from gear_rl.train import Trainer, load_config

    model, _ = load_policy(str(model_dir))
    n_matmul, layers = _matmul_params(model), int(model.config.num_hidden_layers)
    hidden = int(model.config.hidden_size)
    del model
    for label in ("gear", "grpo"):
        records = numbers.get(f"default/{label}")
        if not records:
            report.line(False, f"(c) default budget {label}", "no (a) run to read")
            continue
        last = records[-1]
        tokens = last.get("rollout_tok_per_s", 0) * last.get("time/rollout", 0)
        rows = default_rows(quick)
        # response tokens only (the prompts' are not in the record): a lower bound on the MFU
        flops = _flops_per_step(n_matmul, layers, hidden, [round(tokens / rows)] * rows)
        report.line(None, f"(c) default budget {label}",
                    f"{float(last['time/step']):.2f} s/step (last of {len(records)}), update "
                    f"{float(last['time/update']):.2f} s, {tokens:.0f} response tokens; "
                    f"{_mfu(flops, float(last['time/step']), device)} (response tokens only)")
    groups, samples, low, high = _lent_sizes(quick)["paper"]
    base = [f"model={model_dir}", f"device={device}", "precision=bf16", "seed=0",
            "log.report_to=none", "log.progress=false", f"rollout.prompts_per_step={groups}",
            f"rollout.samples_per_prompt={samples}", "rollout.max_new_tokens=1",
            f"rollout.batch_size={min(groups * samples, 256)}", "optim.lr=1e-12",
            *_lent_sizes(quick)["paper_overrides"]]
    batch, times = None, {}
    for label in ("gear", "grpo"):
        trainer = Trainer(load_config(None, [*base, f"estimator={label}",
                                             f"out={out / f'paper-{label}'}"]))
        try:
            if batch is None:
                batch = _synthetic_batch(trainer, (low, high), 0)
            phases = {}
            _sync(device)
            start = time.perf_counter()
            fusion = trainer.engine.fusion(batch)
            scores = trainer.score(batch, fusion)
            _sync(device)
            phases["signals"] = time.perf_counter() - start
            mark = time.perf_counter()
            credit = trainer.credit_for_update(batch, scores, 1)
            phases["credit"] = time.perf_counter() - mark
            mark = time.perf_counter()
            update = trainer.update(batch, scores, credit, 1)
            _sync(device)
            # as Trainer.step: a fused signal pass and the inline credit ran inside the update
            phases["update"] = time.perf_counter() - mark - credit.seconds
            phases["credit"] += credit.seconds
            total = time.perf_counter() - start
            finite = bool(torch.isfinite(update.advantages).all())
            peak = (f", CUDA peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
                    if torch.device(device).type == "cuda" else "")
        finally:
            trainer.close()
        lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids,
                                                       strict=True)]
        flops = _flops_per_step(n_matmul, layers, hidden, lengths)
        times[label] = total
        fused = "" if fusion is None else f" (student side fused into the update: {fusion.value})"
        report.line(finite, f"(c) paper-like {label} {groups}x{samples}",
                    f"{total:.2f} s after rollout (signals {phases['signals']:.2f}{fused}, credit "
                    f"{phases['credit']:.2f}, update {phases['update']:.2f}); "
                    f"{sum(lengths)} tokens; {_mfu(flops, total, device)}; update alone "
                    f"{_mfu(flops, phases['update'], device)}{peak}")
    if len(times) == 2:
        report.line(None, "(c) GEAR / GRPO on the same batch",
                    f"{times['gear'] / times['grpo']:.2f}x ({times['gear']:.2f} s vs "
                    f"{times['grpo']:.2f} s, rollout excluded)")


def check_lent(args: argparse.Namespace) -> int:
    """The lent machine's check: (a), (b), (c) on ``--device`` (auto: cuda when there is one)
    with a summary table; ``--quick``: the CPU rehearsal's sizes."""
    import tempfile

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    print(f"== device check (lent machine path) on {device} ({where}): torch {torch.__version__}"
          f"{', quick sizes' if args.quick else ''}", flush=True)
    report = Report()
    lines: list[str] = []
    original = report.line

    def line(ok: bool | None, name: str, detail: str) -> None:
        original(ok, name, detail)
        lines.append(f"{'INFO' if ok is None else ('PASS' if ok else 'FAIL'):<4}  {name}")

    report.line = line  # type: ignore[method-assign]
    out = Path(args.out or tempfile.mkdtemp(prefix="gear-rl-device-check-"))
    out.mkdir(parents=True, exist_ok=True)
    sizes = _lent_sizes(args.quick)
    start = time.perf_counter()
    smol = write_smollm2_shaped(out / "smollm2-shaped", sizes["layers"])
    report.line(None, "set-up SmolLM2-shaped model",
                f"{sizes['layers']} layers, random weights, written in "
                f"{time.perf_counter() - start:.1f} s")
    numbers: dict[str, Any] = {}
    only = set(args.only.split(","))
    stages = [("a", lambda: lent_train(report, out, device, args.quick,
                                      {"smollm2-shaped": smol, "tiny": Path("tiny-random")},
                                      numbers)),
              ("b", lambda: (report.line(check_signals(argparse.Namespace(
                  device=device, ref_device="cpu", seed=0, groups=4, samples=4)) == 0,
                  "(b) signals + credit, tiny model", "the lines above"),
                  lent_signals(report, device, args.quick))),
              ("c", lambda: lent_numbers(report, out, device, args.quick, smol, numbers))]
    for name, stage in stages:
        if name not in only:
            continue
        spent = time.perf_counter() - start
        if spent > args.budget_s:
            report.line(False, f"({name}) not run", f"{spent:.0f} s spent of the {args.budget_s:g} "
                        "s budget (--budget-s)")
            continue
        mark = time.perf_counter()
        try:
            stage()
        except Exception as exc:
            report.line(False, f"({name}) stopped", f"{type(exc).__name__}: {exc}")
        print(f"-- ({name}) took {time.perf_counter() - mark:.1f} s", flush=True)
    print(f"\n== summary ({time.perf_counter() - start:.0f} s, output {out})")
    print("\n".join(lines))
    print(f"device check: {'FAIL' if report.failed else 'PASS'}")
    return 1 if report.failed else 0


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

    p = sub.add_parser("lent", help="the lent machine's check: a, b, c without weights")
    p.add_argument("--device", default="auto", help="auto: cuda when there is one, else cpu")
    p.add_argument("--quick", action="store_true", help="the CPU rehearsal's sizes")
    p.add_argument("--only", default="a,b,c")
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="a stage that would start after this many seconds is not run (FAIL)")
    p.set_defaults(fn=check_lent)

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
