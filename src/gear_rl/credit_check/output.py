"""The credit check's outputs: ``credit_check.md`` (the tables), ``credit_check.json`` (every
number, and the scored trajectories token by token) and ``credit_check.png`` (per-token
Monte-Carlo advantage beside each estimator's, for a few trajectories). The file names are
:mod:`gear_rl.rundir`'s (``gear-rl report`` reads the JSON by them), the PNG helpers
:mod:`gear_rl.figures`'."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from gear_rl.credit_check.config import CreditCheckConfig
from gear_rl.figures import Plot, figure_png
from gear_rl.rundir import (
    CREDIT_CHECK_JSON,
    CREDIT_CHECK_MD,
    CREDIT_CHECK_PNG,
    atomic_write_bytes,
    atomic_write_text,
)

__all__ = ["format_table", "plot_trajectories", "write_outputs"]

# The estimators drawn in the plot after the variants, in this order (then any others).
_PLOT_ORDER = ("gear", "rlsd", "gear_token_kl", "top_entropy", "grpo")
_PLOT_LINES = 6


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _num(value: Any, signed: bool = True, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _interval(entry: dict[str, Any] | None, signed: bool = True) -> str:
    if not entry or entry.get("value") is None:
        return "—"
    text = _num(entry["value"], signed)
    if entry.get("low") is not None and entry.get("high") is not None:
        text += f" [{_num(entry['low'], signed, 2)}, {_num(entry['high'], signed, 2)}]"
    return text


def _score_table(data: dict[str, Any], truth: str, ks: list[int], ceiling: bool) -> list[str]:
    reference = data["scores"].get("reference")
    head = ["estimator", "Spearman [95% CI]"]
    if reference is not None:
        head.append(f"Δ Spearman vs {reference}")
    head += [f"P@{k} (chance)" for k in ks]
    head += ["|MC| mass in segments (token share)", "mean W, A>0 / A<0", "n"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(label: str, scores: dict[str, Any], diff: dict[str, Any] | None) -> list[str]:
        row = [label, _interval(scores.get("spearman"))]
        if reference is not None:
            row.append(_interval(diff) if diff else "—")
        for k in ks:
            chance = (scores.get(f"chance@{k}") or {}).get("value")
            row.append(f"{_interval(scores.get(f'precision@{k}'), signed=False)} "
                       f"({_num(chance, signed=False)})")
        mass = scores.get("segment_mass")
        row.append("—" if mass is None else f"{_interval(mass, signed=False)} "
                   f"({_num((scores.get('segment_tokens') or {}).get('value'), False)})")
        if scores.get("weight_pos") is None:
            row.append("—")
        else:
            row.append(" / ".join(_num((scores.get(name) or {}).get("value"), signed=False,
                                       digits=2) for name in ("weight_pos", "weight_neg")))
        spearman = scores.get("spearman") or {}
        row.append(f"{spearman.get('trajectories', 0)} ({spearman.get('groups', 0)} groups)")
        return row

    for entry in data["scores"]["rows"]:
        label = entry["label"]
        if entry["floor"]:
            label += " (floor: uniform credit)"
        elif entry["variant"]:
            label += f" (variant of {entry['estimator']})"
        lines.append("| " + " | ".join(cells(label, entry["scores"][truth],
                                               entry["vs_reference"].get(truth))) + " |")
    if ceiling and data["scores"].get("ceiling"):
        lines.append("| " + " | ".join(cells("**MC replicate 2 vs 1 (noise ceiling)**",
                                             data["scores"]["ceiling"], None)) + " |")
    return lines


def format_table(data: dict[str, Any]) -> str:
    """The markdown report of a credit check's ``data`` (what ``credit_check.json`` holds)."""
    settings, counts = data["settings"], data["counts"]
    ks = list(settings["precision_k"])
    replicates = settings["replicates"]
    m = settings["continuations"]
    first = "the first replicate" if replicates > 1 else "the Monte-Carlo estimate"
    export = settings.get("export")
    if settings["checkpoint"]:
        where = f"{settings['checkpoint']} (step {settings['checkpoint_step']})"
    elif export:
        where = (f"the weights exported from step {export.get('step')} of run "
                 f"`{export.get('run')}` ({export.get('dtype')})")
    else:
        where = "initial weights"
    lines = [
        "# Credit check",
        "",
        f"Model `{settings['model']}` at {where}, task `{settings['task']}` "
        f"({settings['split']} split). Truth: {counts['truth_done']} trajectories from "
        f"{counts['truth_groups']} prompt groups ({counts['groups']} groups of "
        f"{settings['samples_per_prompt']} sampled, {counts['groups_mixed']} with mixed "
        f"outcomes), V at boundaries `{settings['boundaries']}`"
        + (f" every {settings['every']}" if settings["boundaries"] == "tokens"
           and settings["every"] > 1 else "")
        + f", {m} continuations x {replicates} replicate(s), temperature "
        f"{settings['temperature']}, top-p {settings['top_p']}, "
        + ("each continuation the rest of the episode under the agent limits"
           if settings.get("agent_limits") else
           f"budget max_new_tokens={settings['max_new_tokens']} minus the prefix")
        + f"; {counts['continuation_tokens']} continuation tokens"
        + ("" if counts["complete"] else
           f" (**incomplete**: the token budget stopped it after {counts['truth_done']} of "
           f"{counts['truth_planned']} trajectories; rerun to continue)") + ".",
        "",
        f"## Scores against {first} ({m} continuations per boundary)",
        "",
        "Spearman: within-trajectory rank correlation of each estimator's per-unit credit with "
        "the Monte-Carlo advantage (constant credit is defined as 0). P@k: expected share of "
        "the k largest-|credit| units among the k largest-|MC advantage| units (ties broken at "
        "random; chance in parentheses). Segment mass: share of |MC advantage| inside the "
        "estimator's GEAR segments (share of tokens inside in parentheses). 95% percentile "
        "bootstrap intervals over prompt groups. Definitions: docs/credit_check.md.",
        "",
        *_score_table(data, "first", ks, ceiling=True),
    ]
    if replicates < 2:
        lines += ["", "No noise ceiling: it needs replicates >= 2."]
    else:
        ceiling = (data["scores"].get("ceiling") or {}).get("spearman") or {}
        if ceiling.get("low") is not None and ceiling["low"] <= 0:
            lines += ["", f"**The truth is at its noise floor here**: one replicate's ranking "
                      f"agrees with the other's by {_interval(ceiling, True)} (Spearman), an "
                      "interval that reaches 0, so no estimator's score above can be told "
                      "from noise. More continuations per boundary, or more trajectories, "
                      "would be needed to judge the credit of this model on this task."]
    if counts["truth_done"] == 0:
        lines += ["", "**No trajectory has a truth yet**"
                  + (": no sampled group had mixed outcomes; sample more groups, or set "
                     "mixed_only=false" if counts["truth_planned"] == 0 else "") + "."]
    truth = data["scores"]["truth"]["pooled" if replicates > 1 else "first"]
    lines += [
        "",
        "## The truth itself"
        + (f" (both replicates pooled, {m * replicates} continuations)" if replicates > 1
           else ""),
        "",
        f"- mean standard error of V: {_num(data['scores'].get('mean_value_se'), False)}"
        + (f" ({_num(data['scores'].get('mean_value_se_replicate'), False)} for one replicate "
           f"of {m})" if replicates > 1 else ""),
        f"- units with |MC advantage| beyond 2 standard errors: "
        f"{_interval(truth['clear_units'], False)}",
        f"- |MC advantage| mass whose sign opposes the trajectory's outcome advantage: "
        f"{_interval(truth['opposed_mass'], False)}",
        f"- clear units (beyond 2 SE) with the opposite sign: "
        f"{_interval(truth['opposed_clear'], False)}",
    ]
    if replicates > 1:
        lines += ["", f"## Scores against both replicates pooled ({m * replicates} "
                  "continuations per boundary; no ceiling at this precision)", "",
                  *_score_table(data, "pooled", ks, ceiling=False)]
    if data.get("skipped"):
        lines += ["", "## Not scored", ""]
        lines += [f"- `{name}`: {why}" for name, why in sorted(data["skipped"].items())]
    timing = data["timing"]
    lines += ["", "## Run", "",
              f"- machine: {data['machine']}",
              f"- sampling {timing['sample_seconds']} s, truth {timing['truth_seconds_total']} s "
              f"in all ({timing['truth_seconds_this_session']} s and "
              f"{timing['truth_tokens_this_session']} tokens this session), scoring "
              f"{timing['score_seconds']} s; this session {timing['wall_seconds_this_session']} "
              "s wall",
              ("- continuations: whole episodes from each prefix (agent limits "
               f"{settings['agent_limits']}; docs/credit_check.md, \"Limits\")"
               if settings.get("agent_limits") else
               f"- shared prefix KV cache: {settings['shared_prefix']}")]
    return "\n".join(lines) + "\n"


def _plot_labels(data: dict[str, Any]) -> list[str]:
    rows = data["scores"]["rows"]
    labels = [r["label"] for r in rows if r["variant"]]
    labels += [name for name in _PLOT_ORDER if any(r["label"] == name for r in rows)]
    labels += [r["label"] for r in rows if r["label"] not in labels]
    return labels[:_PLOT_LINES]


def _pick(trajectories: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Up to ``count`` trajectories, alternately with positive and negative outcome advantage."""
    positive = [t for t in trajectories if t["advantage"] > 0]
    negative = [t for t in trajectories if t["advantage"] < 0]
    rest = [t for t in trajectories if t["advantage"] == 0]
    picked: list[dict[str, Any]] = []
    while len(picked) < count and (positive or negative or rest):
        for pool in (positive, negative):
            if pool and len(picked) < count:
                picked.append(pool.pop(0))
        if not positive and not negative and rest and len(picked) < count:
            picked.append(rest.pop(0))
    return picked


def plot_trajectories(data: dict[str, Any], count: int) -> bytes | None:
    """PNG bytes: for up to ``count`` scored trajectories, the per-token Monte-Carlo advantage
    (bars; +-2 standard errors where every boundary was estimated) above each estimator's
    per-token advantage scaled to its largest magnitude in the trajectory. None when there is
    nothing to draw."""
    picked = _pick(list(data["trajectories"]), count)
    if not picked:
        return None
    labels = _plot_labels(data)
    width = max(8.0, min(30.0, 0.28 * max(len(t["tokens"]) for t in picked)))
    figure = Figure(figsize=(width, 4.2 * len(picked)), layout="constrained")
    grid = figure.add_gridspec(2 * len(picked), 1, height_ratios=[1.0, 1.0] * len(picked))
    for n, traj in enumerate(picked):
        top = figure.add_subplot(grid[2 * n])
        bottom = figure.add_subplot(grid[2 * n + 1], sharex=top)
        length = len(traj["tokens"])
        xs = list(range(length))
        bounds = traj["boundaries"]
        every_token = bounds == list(range(length + 1))
        errors = None
        if every_token:
            se = [v if v is not None else 0.0 for v in traj["values_se"]]
            errors = [2 * math.hypot(se[t + 1], se[t]) for t in range(length)]
        colours = ["#1a9641" if v >= 0 else "#d7191c" for v in traj["mc_advantage"]]
        top.bar(xs, traj["mc_advantage"], color=colours, yerr=errors, capsize=2,
                error_kw={"elinewidth": 0.7, "ecolor": "#555555"})
        top.axhline(0, color="#888888", linewidth=0.6)
        top.set_ylabel("MC advantage")
        top.set_title(f"row {traj['row']} ({traj['problem_id']}): reward {traj['reward']:g}, "
                      f"outcome advantage {traj['advantage']:+.2f}; "
                      f"{json.dumps(traj['response'][:80])}", fontsize=9, loc="left")
        for label in labels:
            values = traj["advantages"].get(label)
            if values is None:
                continue
            scale = max((abs(v) for v in values), default=0.0) or 1.0
            bottom.plot(xs, [v / scale for v in values], marker=".", linewidth=1.0,
                        label=label)
        bottom.axhline(0, color="#888888", linewidth=0.6)
        bottom.set_ylabel("advantage / max|.|")
        bottom.set_xlabel("response token")
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        step = max(1, length // 60)
        bottom.set_xticks(xs[::step])
        bottom.set_xticklabels([json.dumps(t, ensure_ascii=False)[1:-1][:8]
                                for t in traj["tokens"][::step]], rotation=90, fontsize=7)
        top.tick_params(labelbottom=False)
    plot = Plot(name="credit_check", title="per-token Monte-Carlo advantage and each "
                "estimator's advantage", figure=figure)
    return figure_png(plot, dpi=90)


def write_outputs(out: Path, data: dict[str, Any], check: CreditCheckConfig
                  ) -> tuple[Path, Path, Path | None, str]:
    """Write the three files into ``out``; returns their paths and the markdown text."""
    data = _json_safe(data)
    table = format_table(data)
    markdown, json_path = out / CREDIT_CHECK_MD, out / CREDIT_CHECK_JSON
    atomic_write_text(json_path, json.dumps(data, indent=1, allow_nan=False) + "\n")
    png = plot_trajectories(data, check.plot_trajectories) if check.plot_trajectories else None
    plot = None
    if png is not None:
        plot = out / CREDIT_CHECK_PNG
        atomic_write_bytes(plot, png)
    else:
        (out / CREDIT_CHECK_PNG).unlink(missing_ok=True)
    atomic_write_text(markdown, table)
    return markdown, json_path, plot, table
