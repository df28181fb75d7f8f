"""The report page's inline stylesheet and script (one self-contained file: no CDN, no fetch).

The script reads the run's trajectories from ``<script id="report-data" type="application/json">``
and draws the token-credit viewer: a step and a group selector, a signal selector, and the
group's positive and negative trajectories side by side, each token coloured by the selected
signal, GEAR segments outlined, observation tokens greyed, a tooltip with every number.
"""

STYLE = r"""
:root { --fg: #1d1d1f; --muted: #6b6b70; --line: #d7d7db; --panel: #fafafb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       margin: 0 auto; max-width: 1400px; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); }
.meta { color: var(--muted); }
.meta code { color: var(--fg); }
.curves { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr));
          gap: 12px; }
.curves figure { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 4px; }
.curves img { width: 100%; height: auto; display: block; }
.curves figcaption { color: var(--muted); font-size: 12px; padding: 2px 6px; }
.notes { color: var(--muted); font-size: 13px; }
.controls { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; margin: 8px 0; }
.controls label { font-weight: 600; }
.controls select { font: inherit; padding: 2px 4px; }
.problem { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
           padding: 6px 10px; white-space: pre-wrap; font-size: 13px; max-height: 9em;
           overflow: auto; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-top: 10px; }
.traj { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px;
        background: #fff; min-height: 80px; }
.traj h3 { font-size: 14px; margin: 0 0 6px; }
.traj.pos h3 { color: #17703a; } .traj.neg h3 { color: #a4262c; }
.traj .info { color: var(--muted); font-size: 12px; margin-bottom: 6px; }
.tokens { font: 13px/1.9 ui-monospace, "DejaVu Sans Mono", Menlo, monospace;
          white-space: pre-wrap; word-break: break-word; }
.tok { border-radius: 2px; padding: 1px 0; cursor: default; }
.tok:hover { outline: 1px solid #000; }
.tok.obs { color: #a0a0a6; background: #f0f0f2 !important; font-style: italic; }
.seg { outline: 2px solid #3a5fcd; outline-offset: 1px; border-radius: 3px; }
.nl { color: #b0b0b6; }
.legend { display: flex; align-items: center; gap: 8px; font-size: 12px; color: var(--muted); }
.legend .bar { width: 180px; height: 12px; border: 1px solid var(--line); border-radius: 2px; }
.empty { color: var(--muted); font-style: italic; }
#tooltip { position: fixed; pointer-events: none; display: none; z-index: 10;
           background: #1d1d1f; color: #fff; border-radius: 5px; padding: 6px 8px;
           font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; max-width: 360px;
           box-shadow: 0 2px 8px rgba(0,0,0,.3); }
#tooltip table { border-collapse: collapse; }
#tooltip td { padding: 0 6px 0 0; vertical-align: top; }
#tooltip td.k { color: #b9b9c0; }
table.counts { border-collapse: collapse; font-size: 13px; }
table.counts th, table.counts td { border-bottom: 1px solid var(--line); padding: 3px 10px;
                                   text-align: right; }
table.counts th:nth-child(2), table.counts td:nth-child(2) { text-align: left; }
table.counts td code { background: var(--panel); padding: 0 3px; }
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const SIGNALS = DATA.signals;
const $ = (id) => document.getElementById(id);
const PALETTE = ["#8fb3ff", "#ffc46b", "#9be3a8", "#f4a3c8", "#b9a6ff", "#7fdde0", "#ffd8a0"];

function fmt(v, integer = false) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  if (integer) return String(v);
  return Math.abs(v) >= 1000 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3)
                                                                  : v.toFixed(4);
}

function shown(text) {
  // Make whitespace-only and control tokens visible without changing normal text.
  if (text === "") return "∅";
  return text.replace(/\t/g, "→\t");
}

function fillSelect(select, options) {
  select.innerHTML = "";
  for (const [value, label] of options) {
    const option = document.createElement("option");
    option.value = value; option.textContent = label; select.appendChild(option);
  }
}

function currentPair() {
  const step = DATA.steps[Number($("step").value)];
  return step ? step.pairs[Number($("pair").value)] : null;
}

function scaleFor(signal, trajs) {
  // One colour scale for both panels, over their policy tokens.
  const values = [];
  for (const t of trajs) {
    const vals = t.signals[signal.key];
    if (!vals) continue;
    vals.forEach((v, i) => { if (t.mask[i] && v !== null) values.push(v); });
  }
  if (!values.length) return null;
  let lo = Math.min(...values), hi = Math.max(...values);
  if (signal.kind === "diverging") {
    const c = signal.center;
    const r = Math.max(Math.abs(lo - c), Math.abs(hi - c)) || 1;
    return {lo: c - r, hi: c + r, center: c, radius: r};
  }
  if (signal.fixed) { lo = signal.fixed[0]; hi = signal.fixed[1]; }
  if (hi - lo < 1e-12) hi = lo + 1;
  return {lo, hi};
}

function colour(signal, scale, value, segIndex) {
  if (signal.kind === "segment") {
    return segIndex >= 0 ? PALETTE[segIndex % PALETTE.length] : "transparent";
  }
  if (value === null || value === undefined || !scale) return "transparent";
  if (signal.kind === "diverging") {
    const t = Math.max(-1, Math.min(1, (value - scale.center) / scale.radius));
    return t >= 0 ? `rgba(26, 150, 65, ${(0.08 + 0.8 * t).toFixed(3)})`
                  : `rgba(215, 48, 39, ${(0.08 + 0.8 * -t).toFixed(3)})`;
  }
  const t = Math.max(0, Math.min(1, (value - scale.lo) / (scale.hi - scale.lo)));
  return `rgba(230, 85, 13, ${(0.04 + 0.86 * t).toFixed(3)})`;
}

function renderLegend(signal, scale) {
  const legend = $("legend");
  legend.innerHTML = "";
  const text = document.createElement("span");
  if (signal.kind === "segment") {
    text.textContent = "each segment (same onset) in its own colour and outlined; " +
                       "uncoloured tokens are outside segments";
    legend.appendChild(text); return;
  }
  if (!scale) { text.textContent = `this run logged no ${signal.label}`; legend.appendChild(text);
                return; }
  const bar = document.createElement("span");
  bar.className = "bar";
  bar.style.background = signal.kind === "diverging"
    ? "linear-gradient(to right, rgba(215,48,39,.88), rgba(255,255,255,1), rgba(26,150,65,.88))"
    : "linear-gradient(to right, rgba(230,85,13,.04), rgba(230,85,13,.9))";
  const lo = document.createElement("span"); lo.textContent = fmt(scale.lo);
  const hi = document.createElement("span"); hi.textContent = fmt(scale.hi);
  text.textContent = signal.help;
  legend.append(lo, bar, hi, text);
}

function renderTraj(box, traj, signal, scale, side) {
  box.innerHTML = "";
  box.className = "traj " + side;
  const title = document.createElement("h3");
  if (!traj) {
    title.textContent = side === "pos" ? "positive trajectory" : "negative trajectory";
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = "no trajectory of this sign was logged for this group";
    box.append(title, empty); return;
  }
  const label = traj.advantage === null ? "advantage-not-a-number"
              : traj.advantage > 0 ? "positive"
              : traj.advantage < 0 ? "negative" : "zero-advantage";
  title.textContent = `${label} trajectory (row ${traj.row})`;
  const info = document.createElement("div");
  info.className = "info";
  info.textContent = `reward ${fmt(traj.reward, Number.isInteger(traj.reward))} · ` +
    `advantage ${fmt(traj.advantage)} · ` +
    `extracted ${JSON.stringify(traj.extracted)} · ${traj.finished ? "finished" : "truncated"}` +
    ` · ${traj.tokens.length} tokens`;
  const tokens = document.createElement("div");
  tokens.className = "tokens";
  const values = traj.signals[signal.key];
  const onsets = traj.signals.segment;
  const segOrder = new Map();
  let segBox = null, segOnset = -1;
  traj.tokens.forEach((text, i) => {
    const onset = onsets ? onsets[i] : -1;
    if (onset !== segOnset) { segBox = null; segOnset = onset; }
    if (onset >= 0 && !segBox) {
      segBox = document.createElement("span");
      segBox.className = "seg"; segBox.dataset.onset = onset;
      tokens.appendChild(segBox);
      if (!segOrder.has(onset)) segOrder.set(onset, segOrder.size);
    }
    const span = document.createElement("span");
    span.className = traj.mask[i] ? "tok" : "tok obs";
    span.dataset.i = i; span.dataset.side = side;
    const parts = shown(text).split("\n");
    parts.forEach((part, j) => {
      if (j > 0) { const nl = document.createElement("span"); nl.className = "nl";
                   nl.textContent = "↵\n"; span.appendChild(nl); }
      if (part) span.appendChild(document.createTextNode(part));
    });
    if (traj.mask[i]) {
      span.style.background = colour(signal, scale, values ? values[i] : null,
                                     onset >= 0 ? segOrder.get(onset) : -1);
    }
    (segBox || tokens).appendChild(span);
  });
  box.append(title, info, tokens);
}

function render() {
  const pair = currentPair();
  const signal = SIGNALS.find((s) => s.key === $("signal").value);
  if (!pair) { $("problem").textContent = "no samples in this run"; return; }
  $("problem").textContent = `problem ${pair.problem_id} · reference answer ` +
    `${JSON.stringify(pair.answer)}\n${pair.prompt}`;
  const trajs = [pair.pos, pair.neg].filter(Boolean);
  const scale = scaleFor(signal, trajs);
  renderTraj($("traj-pos"), pair.pos, signal, scale, "pos");
  renderTraj($("traj-neg"), pair.neg, signal, scale, "neg");
  renderLegend(signal, scale);
  document.body.dataset.signal = signal.key;
}

function onStep() {
  const step = DATA.steps[Number($("step").value)];
  fillSelect($("pair"), step.pairs.map((p, i) => [i, `group ${p.group} · ${p.problem_id}` +
    (p.pos && p.neg ? " (+/−)" : p.pos ? " (+ only)" : p.neg ? " (− only)" : " (0)")]));
  render();
}

function showTooltip(event) {
  const span = event.target.closest(".tok");
  if (!span) return;
  const pair = currentPair();
  const traj = span.dataset.side === "pos" ? pair.pos : pair.neg;
  const i = Number(span.dataset.i);
  const rows = [["token", JSON.stringify(traj.tokens[i])], ["index", i],
                ["kind", traj.mask[i] ? "policy" : "observation"]];
  if (traj.token_ids) rows.push(["token id", traj.token_ids[i]]);
  for (const s of SIGNALS) {
    const vals = traj.signals[s.key];
    rows.push([s.label, vals ? fmt(vals[i], s.kind === "segment") : "—"]);
  }
  for (const [key, label] of [["student_logprobs", "student log p"],
                              ["teacher_logprobs", "teacher log p"]]) {
    if (traj.extra[key]) rows.push([label, fmt(traj.extra[key][i])]);
  }
  const tip = $("tooltip");
  tip.innerHTML = "";
  const table = document.createElement("table");
  for (const [k, v] of rows) {
    const tr = document.createElement("tr");
    const a = document.createElement("td"); a.className = "k"; a.textContent = k;
    const b = document.createElement("td"); b.textContent = String(v);
    b.dataset.key = k; tr.append(a, b); table.appendChild(tr);
  }
  tip.appendChild(table);
  tip.style.display = "block";
  const x = Math.min(event.clientX + 14, window.innerWidth - 370);
  tip.style.left = `${Math.max(4, x)}px`; tip.style.top = `${event.clientY + 16}px`;
}

function hideTooltip(event) {
  if (!event.relatedTarget || !event.relatedTarget.closest(".tok")) {
    $("tooltip").style.display = "none";
  }
}

function init() {
  fillSelect($("signal"),
             SIGNALS.map((s) => [s.key, s.label + (s.available ? "" : " (not logged)")]));
  $("signal").value = DATA.default_signal;
  fillSelect($("step"), DATA.steps.map((s, i) => [i, s.label || `step ${s.step}`]));
  $("step").addEventListener("change", onStep);
  $("pair").addEventListener("change", render);
  $("signal").addEventListener("change", render);
  for (const id of ["traj-pos", "traj-neg"]) {
    $(id).addEventListener("mouseover", showTooltip);
    $(id).addEventListener("mouseout", hideTooltip);
  }
  if (DATA.steps.length) onStep(); else render();
  document.body.dataset.ready = "1";
}
init();
"""
