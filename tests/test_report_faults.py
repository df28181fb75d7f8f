"""``gear-rl report`` on a run whose ``samples.jsonl`` holds values that are not numbers: JSON
``NaN`` / ``Infinity`` (what Python's json writes for float('nan') / float('inf')) and nulls.
They are shown as missing in the viewer and left out of the plots and counts; nothing crashes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from PIL import Image

from gear_rl.cli import main
from gear_rl.report import build_report, load_run, normalized_divergence, top_divergence_tokens
from gear_rl.report.data import weight_stats_by_step

NAN, INF = float("nan"), float("inf")


def sample(step: int, group: int, advantage: float, tokens: list[str], **fields) -> dict:
    """One samples.jsonl record in the trainer's format (gear_rl.train.records)."""
    n = len(tokens)
    record = {"step": step, "row": group * 2 + (advantage < 0), "group": group,
              "problem_id": f"p{group}", "prompt": "<|im_start|>user\nq<|im_end|>\n",
              "answer": "4", "response": "".join(tokens), "extracted": "4",
              "reward": float(advantage > 0), "advantage": advantage, "finished": True,
              "tokens": tokens, "token_ids": list(range(n)), "mask": [1] * n,
              "entropy": [1.0] * n, "divergence": [0.5] * n, "student_logprobs": [-1.0] * n,
              "teacher_logprobs": [-1.5] * n, "token_advantage": [advantage] * n,
              "weight": [1.0] * n, "segment_onset": [-1] * n}
    record.update(fields)
    return record


def write_run(path: Path, samples: list[dict], steps: int = 2) -> Path:
    """A finished GEAR run directory in the trainer's layout with these samples."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({
        "model": "tiny-random", "task": "products", "estimator": "gear", "credit": {},
        "steps": steps, "seed": 0, "eval": {"k": 2}}))
    metrics = [{"step": s, "reward_mean": 0.5, "entropy_mean": 1.0, "segment_frac": 0.2,
                "weight_mean_pos": 1.1, "weight_mean_neg": 0.9, "time/step": 1.0}
               for s in range(1, steps + 1)]
    metrics[-1].update({"eval/mean@2": 0.5, "eval/pass@2": 0.75})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    # json.dumps writes float("nan") as NaN and float("inf") as Infinity, as the trainer would.
    (path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (path / "summary.json").write_text(json.dumps({"steps": steps, "eval_end_mean@2": 0.5}))
    return path


def _embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page,
                      re.S)
    assert match, "no embedded data block"

    def not_json(name: str) -> None:
        raise AssertionError(f"the embedded data holds {name}, which is not JSON")

    return json.loads(match.group(1), parse_constant=not_json)


def _traj(data: dict, step: int, sign: str) -> dict:
    (entry,) = [s for s in data["steps"] if s["step"] == step]
    return entry["pairs"][0][sign]


def test_nan_weights_render_as_missing(tmp_path: Path, capsys) -> None:
    samples = [sample(1, 0, 1.0, ["2", " +", " 2"], weight=[NAN, 1.5, INF]),
               sample(1, 0, -1.0, ["5", "!"], weight=[0.5, NAN]),
               sample(2, 1, 0.8, ["4"], weight=[NAN])]
    run = write_run(tmp_path / "run", samples)
    assert "NaN" in (run / "samples.jsonl").read_text()
    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    # The spread of the weights is over the finite ones only (step 2 has none).
    stats = weight_stats_by_step(load_run(run).samples)
    assert stats == {"pos": {1: (1.5, 0.0)}, "neg": {1: (0.5, 0.0)}}
    with Image.open(out / "weights.png") as image:
        assert json.loads(image.text["Axes"])[0]["ylabel"] == "token weight W"
    data = _embedded_data((out / "report.html").read_text())
    assert _traj(data, 1, "pos")["signals"]["weight"] == [None, 1.5, None]
    assert _traj(data, 1, "neg")["signals"]["weight"] == [0.5, None]
    assert _traj(data, 2, "pos")["signals"]["weight"] == [None]


def test_nan_and_null_elsewhere_render_as_missing(tmp_path: Path) -> None:
    samples = [
        sample(1, 0, 1.0, ["a", "b", "c", "d"], divergence=[0.2, NAN, 0.6, 0.4],
               entropy=[INF, 1.0, None, 0.5], segment_onset=[None, 1, 1, NAN],
               token_advantage=[1.0, NAN, 1.2, 0.8], student_logprobs=[-1.0, -INF, -0.5, -0.2],
               reward=NAN),
        sample(1, 0, -1.0, ["x", "y"], divergence=[NAN, NAN], mask=[1, NAN]),
        sample(2, 1, NAN, ["z"], divergence=[INF], reward=INF),
    ]
    run = write_run(tmp_path / "run", samples)
    report = build_report(run, tmp_path / "out")
    assert {"heldout", "weights", "segments"} <= {path.stem for path in report.plots}
    data = _embedded_data(report.html.read_text())
    pos = _traj(data, 1, "pos")
    # The missing divergence takes no part in the min-max of the others.
    assert pos["signals"]["divergence"] == [0.2, None, 0.6, 0.4]
    assert pos["signals"]["normalized"] == pytest.approx([0.0, None, 1.0, 0.5])
    assert pos["signals"]["entropy"] == [None, 1.0, None, 0.5]
    assert pos["signals"]["segment"] == [-1, 1, 1, -1]
    assert pos["signals"]["advantage"] == [1.0, None, 1.2, 0.8]
    assert pos["extra"]["student_logprobs"] == [-1.0, None, -0.5, -0.2]
    assert pos["reward"] is None and pos["advantage"] == 1.0
    neg = _traj(data, 1, "neg")
    assert neg["signals"]["normalized"] == [None, None]
    assert neg["mask"] == [1, 1]  # a mask value that is not a number: as if not logged
    lone = _traj(data, 2, "pos")  # an advantage that is not a number: shown, as missing
    assert lone["advantage"] is None and lone["reward"] is None
    assert lone["signals"]["normalized"] == [None]
    # Missing divergences are not counted in the top-tokens table.
    rows = {r.token: (r.above, r.total) for r in top_divergence_tokens(samples)}
    assert rows == {"c": (1, 1), "d": (1, 1)}
    assert 'id="top-tokens"' in report.html.read_text()


def test_normalised_divergence_of_missing_values() -> None:
    record = sample(1, 0, 1.0, ["a", "b", "obs", "c"], divergence=[1.0, None, 9.0, NAN],
                    mask=[1, 1, 0, 1])
    normalized = normalized_divergence(record)
    assert normalized[0] == 0.0 and normalized[2] == 0.0  # one finite policy value: no range
    assert normalized[1] is None and normalized[3] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in normalized)
