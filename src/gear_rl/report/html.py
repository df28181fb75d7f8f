"""``gear-rl report RUN_DIR``: one self-contained HTML page and the PNG curves of a run.

The page (``report.html``) holds everything inline: the curves as base64 PNGs, the trajectories
as JSON, the stylesheet and the viewer script (:mod:`gear_rl.report.assets`). It opens offline;
nothing is fetched.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gear_rl.dataclass_config import check_output_folder
from gear_rl.figures import figure_png
from gear_rl.report.assets import SCRIPT, STYLE
from gear_rl.report.data import (
    RunData,
    TokenCount,
    eval_keys,
    finite,
    load_run,
    normalized_divergence,
    policy_mask,
    top_divergence_tokens,
)
from gear_rl.report.plots import training_curves
from gear_rl.rundir import atomic_write_bytes

__all__ = ["Report", "build_report", "render_html", "script_json", "viewer_data"]

# (key in the viewer, samples.jsonl field or derived, label, kind, help text)
SIGNALS: tuple[tuple[str, str, str, str, str], ...] = (
    ("divergence", "divergence", "divergence", "sequential",
     "d_t: reverse KL student -> ground-truth-conditioned teacher (nats)"),
    ("normalized", "<derived>", "normalised divergence", "sequential",
     "n_t: divergence min-max normalised over the trajectory's policy tokens (GEAR step 3)"),
    ("entropy", "entropy", "entropy", "sequential", "H_t: student entropy (nats)"),
    ("segment", "segment_onset", "segment", "segment",
     "GEAR segments: tokens sharing an onset"),
    ("weight", "weight", "weight", "diverging",
     "W_t = token advantage / trajectory advantage; green > 1 (amplified), red < 1"),
    ("advantage", "token_advantage", "final advantage", "diverging",
     "Ahat_t: the per-token advantage the loss used; green > 0, red < 0"),
)
# Offered only when the run has a credit check (gear-rl credit-check RUN_DIR).
MC_SIGNAL: tuple[str, str, str, str, str] = (
    "mc_advantage", "mc_advantage", "Monte-Carlo advantage", "diverging",
    "V(x, y_<=t) - V(x, y_<t) from the credit check (credit_check/credit_check.json; a span's "
    "advantage shared over its tokens); green > 0, red < 0")


def _signals_of(run: RunData) -> tuple[tuple[str, str, str, str, str], ...]:
    return (*SIGNALS, MC_SIGNAL) if run.credit_check else SIGNALS


@dataclass
class Report:
    """What ``build_report`` wrote.

    Attributes:
        html: the report page.
        plots: the PNG curves.
        skipped: one note per curve or section that could not be drawn, with the reason.
    """

    html: Path
    plots: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _finite_list(values: Any) -> list[float | None] | None:
    if values is None:
        return None
    return [finite(v) for v in values]


def _json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None (shown as missing), so
    the embedded data is strict JSON whatever a log holds."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


# JSON's grammar puts these characters only inside strings, where the escape means the same.
_SCRIPT_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(value: Any) -> str:
    """``value`` as strict JSON text that can sit inside ``<script type="application/json">``
    and end exactly where the page ends that element, whatever strings it holds.

    Every ``<``, ``>`` and ``&`` is written as a ``\\u`` escape and everything else outside
    ASCII too, so the text holds no markup at all: no ``</script``, and no ``<!--`` that would
    put the HTML tokenizer into its "script data (double) escaped" states, where a later
    ``</script>`` no longer ends the element (in Chromium the viewer then draws nothing).
    ``JSON.parse`` of the element's text gives back ``value`` exactly (floats that are not
    finite become null: see ``_json_safe``)."""
    text = json.dumps(_json_safe(value), ensure_ascii=True, allow_nan=False)
    return text.translate(_SCRIPT_ESCAPES)


def _trajectory(sample: dict[str, Any], mode: str,
                signal_list: tuple[tuple[str, str, str, str, str], ...] = SIGNALS
                ) -> dict[str, Any]:
    tokens = [str(t) for t in sample["tokens"]]
    mask = policy_mask(sample)
    signals: dict[str, Any] = {}
    for key, source, *_ in signal_list:
        if key == "normalized":
            signals[key] = normalized_divergence(sample, mode)
        elif key == "segment":
            onsets = sample.get(source)
            signals[key] = None if onsets is None else [
                -1 if (onset := finite(v)) is None else int(onset) for v in onsets]
        else:
            signals[key] = _finite_list(sample.get(source))
    advantage = sample.get("advantage")
    return {
        "row": sample.get("row"), "reward": finite(sample.get("reward")),
        # not logged: 0 (no contrast); logged but not a number (NaN): missing
        "advantage": 0.0 if advantage is None else finite(advantage),
        "extracted": sample.get("extracted"), "finished": bool(sample.get("finished", True)),
        "tokens": tokens, "mask": mask, "token_ids": sample.get("token_ids"),
        "signals": signals,
        "extra": {key: _finite_list(sample.get(key))
                  for key in ("student_logprobs", "teacher_logprobs")},
    }


def _pairs(samples: list[dict[str, Any]], mode: str,
           signal_list: tuple[tuple[str, str, str, str, str], ...] = SIGNALS
           ) -> list[dict[str, Any]]:
    """A step's samples grouped by group: the most positive and most negative trajectory."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for sample in samples:
        key = sample.get("group", sample.get("problem_id", sample.get("row")))
        groups.setdefault(key, []).append(sample)
    pairs = []
    for key, members in groups.items():
        def adv(s: dict[str, Any]) -> float:
            return finite(s.get("advantage")) or 0.0

        positive = max(members, key=adv)
        negative = min(members, key=adv)
        pos = positive if adv(positive) > 0 else None
        neg = negative if adv(negative) < 0 else None
        if pos is None and neg is None:
            pos = members[0]  # no contrast (all advantages 0): show it on its own
        first = members[0]
        pairs.append({
            "group": key, "problem_id": first.get("problem_id"), "answer": first.get("answer"),
            "prompt": first.get("prompt") or "",
            "pos": None if pos is None else _trajectory(pos, mode, signal_list),
            "neg": None if neg is None else _trajectory(neg, mode, signal_list),
        })
    # Groups with both signs first: those are what the viewer is for.
    pairs.sort(key=lambda p: not (p["pos"] and p["neg"]))
    return pairs


def viewer_data(run: RunData, max_steps: int = 60) -> dict[str, Any]:
    """The JSON the viewer script reads: signals and, for at most ``max_steps`` logged steps
    (evenly spaced, first and last included), each group's positive/negative trajectories."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
    by_step: dict[int, list[dict[str, Any]]] = {}
    for sample in run.samples:
        step = sample.get("step")
        by_step.setdefault(int(step) if isinstance(step, int) else -1, []).append(sample)
    steps = sorted(by_step)
    if len(steps) > max_steps:
        picks = sorted({round(i * (len(steps) - 1) / (max_steps - 1)) for i in range(max_steps)}
                       if max_steps > 1 else {len(steps) - 1})
        steps = [steps[i] for i in picks]
    mode = run.normalize_mode
    signal_list = _signals_of(run)
    available = {key: any(_trajectory_has(s, source) for s in (*run.samples, *run.credit_check))
                 for key, source, *_ in signal_list}
    signals = [{"key": key, "label": label, "kind": kind, "help": help_text,
                "center": 1.0 if key == "weight" else 0.0, "available": available[key],
                **({"fixed": [0.0, 1.0]} if key == "normalized" else {})}
               for key, _source, label, kind, help_text in signal_list]
    default = next((s["key"] for s in signals if s["available"] and s["key"] == "normalized"),
                   next((s["key"] for s in signals if s["available"]), "advantage"))
    entries = [{"step": step, "pairs": _pairs(by_step[step], mode, signal_list)}
               for step in steps]
    if run.credit_check:  # the credit check's trajectories, with their Monte-Carlo truth
        entries.append({"step": run.credit_check_step,
                        "label": f"credit check (checkpoint step {run.credit_check_step})",
                        "pairs": _pairs(run.credit_check, mode, signal_list)})
    return {"signals": signals, "default_signal": default, "normalize": mode,
            "steps": entries}


def _trajectory_has(sample: dict[str, Any], source: str) -> bool:
    if source == "<derived>":
        source = "divergence"
    return sample.get(source) is not None


def _visible(token: str) -> str:
    return json.dumps(token, ensure_ascii=False)


def _top_tokens_html(rows: list[TokenCount], threshold: float, run: RunData) -> str:
    if not rows:
        reason = ("no sample has a divergence (the estimator computes none)"
                  if not any(s.get("divergence") is not None for s in run.samples)
                  else f"no policy token exceeded {threshold:g}")
        return f'<p class="notes" id="top-tokens-empty">No tokens to count: {reason}.</p>'
    body = "\n".join(
        f"<tr><td>{i}</td><td><code>{html.escape(_visible(r.token))}</code></td>"
        f"<td>{r.above}</td><td>{r.total}</td><td>{r.above / r.total:.0%}</td>"
        f"<td>{r.mean_normalized:.3f}</td></tr>"
        for i, r in enumerate(rows, start=1))
    return ('<table class="counts" id="top-tokens"><thead><tr><th>#</th><th>token</th>'
            f"<th>times n<sub>t</sub> &gt; {threshold:g}</th><th>occurrences</th>"
            "<th>share above</th><th>mean n<sub>t</sub> when above</th></tr></thead>"
            f"<tbody>\n{body}\n</tbody></table>")


def _credit_note(run: RunData) -> str:
    if not run.credit_check:
        return ""
    return (' <span id="credit-check-note">The last <em>Step</em> entry holds the '
            f"{len(run.credit_check)} trajectories of the run's credit check "
            "(<code>credit_check/credit_check.json</code>), which can also be coloured by "
            "their Monte-Carlo advantage.</span>")


def _header(run: RunData) -> str:
    config = run.config
    parts = [f'engine <code id="engine">{html.escape(run.engine)}</code>',
             f"estimator <code>{html.escape(run.estimator)}</code>",
             f"model <code>{html.escape(str(config.get('model', '?')))}</code>",
             f"task <code>{html.escape(str(config.get('task', '?')))}</code>",
             f"seed <code>{run.seed}</code>"]
    steps = [r["step"] for r in run.metrics if "reward_mean" in r]
    parts.append(f"{len(steps)} steps logged")
    for key in eval_keys(run.metrics):
        points = run.series(key)[1]
        if points:
            parts.append(f"{html.escape(key.removeprefix('eval/'))} {points[0]:.3f} &rarr; "
                         f"{points[-1]:.3f}")
    credit = config.get("credit") or {}
    if credit:
        parts.append("credit " + html.escape(json.dumps(credit)))
    return " · ".join(parts)


def render_html(run: RunData, plots: list[tuple[str, str, bytes]], skipped: list[str],
                max_steps: int = 60, threshold: float = 0.1) -> str:
    """The report page as a string. ``plots``: ``(name, title, png bytes)``."""
    figures = "\n".join(
        f'<figure><img class="curve" data-name="{html.escape(name)}" alt="{html.escape(title)}"'
        f' src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for name, title, png in plots)
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in skipped)
    notes_html = f'<ul class="notes" id="skipped">{notes}</ul>' if notes else ""
    data = script_json(viewer_data(run, max_steps))
    rows = top_divergence_tokens(run.samples, threshold, run.normalize_mode)
    logged_steps = len({s.get("step") for s in run.samples})
    title = f"gear-rl report: {run.path.name}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{STYLE}</style></head>
<body data-ready="0">
<h1>{html.escape(title)}</h1>
<p class="meta">{_header(run)}</p>
<h2>Training curves</h2>
<div class="curves" id="curves">{figures or '<p class="notes">No curves.</p>'}</div>
{notes_html}
<h2>Token credit</h2>
<p class="notes">Each token coloured by the selected signal; GEAR segments outlined; observation
tokens greyed; hover a token for its numbers. Left: the group's positive trajectory, right: its
negative one (the trainer logs the best and worst of groups with mixed outcomes). Normalised
divergence uses the run's <code>normalize={html.escape(run.normalize_mode)}</code>.
{_credit_note(run)}</p>
<div class="controls">
  <span><label for="step">Step</label> <select id="step"></select></span>
  <span><label for="pair">Group</label> <select id="pair"></select></span>
  <span><label for="signal">Colour by</label> <select id="signal"></select></span>
  <span class="legend" id="legend"></span>
</div>
<div class="problem" id="problem"></div>
<div class="pair"><div class="traj pos" id="traj-pos"></div>
<div class="traj neg" id="traj-neg"></div></div>
<h2>Tokens most often above normalised divergence {threshold:g}</h2>
<p class="notes">Counted over the policy tokens of all {len(run.samples)} logged trajectories
({logged_steps} steps) in <code>samples.jsonl</code> (the paper's Figure 2 analysis).</p>
{_top_tokens_html(rows, threshold, run)}
<div id="tooltip"></div>
<script type="application/json" id="report-data">{data}</script>
<script>{SCRIPT}</script>
</body></html>
"""


def build_report(run_dir: str | Path, out: str | Path | None = None, *, max_steps: int = 60,
                 threshold: float = 0.1) -> Report:
    """Write ``report.html`` and the curve PNGs of ``run_dir`` into ``out``
    (default ``RUN_DIR/report``).

    Args:
        run_dir: a ``gear-rl train`` run directory.
        out: output folder (created).
        max_steps: most steps of logged samples the viewer embeds (evenly spaced).
        threshold: normalised-divergence threshold of the top-tokens table.

    Raises:
        ValueError: when ``run_dir`` is not a run directory or a file in it is malformed, when
            ``out`` (or a folder on its path) is a file, or for a bad
            ``max_steps``/``threshold``.
    """
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    run = load_run(run_dir)
    folder = check_output_folder(Path(out) if out is not None else run.path / "report",
                                 "report folder")  # a file there: say so, before any work
    plots, skipped = training_curves(run)
    if not run.samples:
        skipped.append("token viewer and top tokens: samples.jsonl is missing or empty "
                       "(log.samples_per_step=0?)")
    pngs = [(plot.name, plot.title, figure_png(plot)) for plot in plots]
    text = render_html(run, pngs, skipped, max_steps=max_steps, threshold=threshold)
    paths = []
    for name, _title, png in pngs:
        paths.append(folder / f"{name}.png")
        atomic_write_bytes(paths[-1], png)
    page = folder / "report.html"
    # A lone surrogate (a token or a folder name that was not valid UTF-8) shows as its escape
    # instead of making the page unwritable.
    atomic_write_bytes(page, text.encode("utf-8", errors="backslashreplace"))
    return Report(html=page, plots=paths, skipped=skipped)
