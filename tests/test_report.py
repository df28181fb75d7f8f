"""``gear-rl report``: the readers, the derived signals, the PNG curves and the HTML page, on a
real tiny trainer run (GEAR, mixed outcomes) and on hand-written run directories in the
trainer's format (a GRPO run with null signals, unknown keys and an eval-only step 0)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from PIL import Image

from conftest import tiny_trainer
from gear_rl.cli import main
from gear_rl.report import (
    RunData,
    build_report,
    load_run,
    normalized_divergence,
    top_divergence_tokens,
)
from gear_rl.report.assets import SCRIPT
from gear_rl.report.data import weight_stats_by_step
from gear_rl.report.html import _json_safe, script_json, viewer_data
from gear_rl.report.plots import training_curves

pytestmark = pytest.mark.usefixtures("one_thread")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED_LABELS = {
    "reward": "mean reward",
    "heldout": "held-out accuracy",
    "entropy": "entropy (nats per policy token)",
    "segments": "fraction of policy tokens",
    "weights": "token weight W",
    "step_time": "seconds per step",
}


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, one_thread) -> Path:
    """A real 3-step GEAR run of a tiny random model, eval every 2 steps."""
    out = tmp_path_factory.mktemp("report") / "run"
    trainer = tiny_trainer(out, "steps=3", "estimator=gear", "rollout.prompts_per_step=3",
                           "eval.at_start=true", "eval.k=2", "eval.every=2",
                           "log.samples_per_step=4", "loss.micro_batch_size=6", model_seed=3)
    trainer.train()
    return out


def _png_axes(path: Path) -> list[dict[str, str]]:
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size[0] > 200 and image.size[1] > 100
        return json.loads(image.text["Axes"])


def _embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page,
                      re.S)
    assert match, "no embedded data block"
    return json.loads(match.group(1))


def write_run(path: Path, *, estimator: str = "grpo", seed: int = 0, steps: int = 3,
              samples: list[dict] | None = None, metrics: list[dict] | None = None,
              credit: dict | None = None) -> Path:
    """A run directory in the trainer's format, written by hand."""
    path.mkdir(parents=True)
    config = {"model": "tiny-random", "task": "products", "estimator": estimator,
              "credit": credit or {}, "steps": steps, "seed": seed, "eval": {"k": 2}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    if metrics is None:
        metrics = [{"step": 0, "eval/mean@2": 0.25, "eval/pass@2": 0.5}]
        metrics += [{"step": s, "reward_mean": 0.1 * s, "entropy_mean": 2.0 - 0.1 * s,
                     "loss": 0.01, "time/step": 1.5, "time/step_cpu": 2.5,
                     "a_future_metric": "text"} for s in range(1, steps + 1)]
        metrics[-1].update({"eval/mean@2": 0.5, "eval/pass@2": 0.75})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples or []))
    return path


def sample(step: int, group: int, advantage: float, tokens: list[str], **fields) -> dict:
    n = len(tokens)
    record = {"step": step, "row": group * 2 + (advantage < 0), "group": group,
              "problem_id": f"p{group}", "prompt": "<|im_start|>user\nq<|im_end|>\n",
              "answer": "4", "response": "".join(tokens), "extracted": "4",
              "reward": float(advantage > 0), "advantage": advantage, "finished": True,
              "tokens": tokens, "token_ids": list(range(n)), "mask": [1] * n,
              "entropy": [1.0] * n, "divergence": None, "student_logprobs": None,
              "teacher_logprobs": None, "token_advantage": [advantage] * n, "weight": None,
              "segment_onset": None, "unknown_future_key": {"x": 1}}
    record.update(fields)
    return record


# ------------------------------------------------------------------------------ real run
def test_report_of_a_real_run(real_run: Path, tmp_path: Path) -> None:
    report = build_report(real_run, tmp_path / "out")
    assert report.html == tmp_path / "out" / "report.html"
    names = {path.stem for path in report.plots}
    assert {"reward", "heldout", "entropy", "segments", "step_time"} <= names
    for path in report.plots:
        labels = _png_axes(path)
        assert labels[0]["xlabel"] == "training step"
        assert labels[0]["ylabel"] == EXPECTED_LABELS[path.stem]
    page = report.html.read_text()
    # One file that needs nothing from the network.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "<link" not in page
    assert page.count('<img class="curve"') == len(report.plots)
    data = _embedded_data(page)
    logged = sorted({s["step"] for s in load_run(real_run).samples})
    assert [s["step"] for s in data["steps"]] == logged
    assert data["default_signal"] == "normalized"
    mixed = [p for s in data["steps"] for p in s["pairs"] if p["pos"] and p["neg"]]
    assert mixed, "the toy task should give at least one group with both signs"
    for pair in mixed:
        assert pair["pos"]["advantage"] > 0 > pair["neg"]["advantage"]
        for traj in (pair["pos"], pair["neg"]):
            normalized = [v for v, m in zip(traj["signals"]["normalized"], traj["mask"],
                                            strict=True) if m]
            assert min(normalized) == 0.0 and max(normalized) == pytest.approx(1.0)
            assert len(traj["signals"]["segment"]) == len(traj["tokens"])
            # The weight shown is the one the loss used: token advantage / trajectory advantage.
            for w, a in zip(traj["signals"]["weight"], traj["signals"]["advantage"],
                            strict=True):
                assert w * traj["advantage"] == pytest.approx(a, abs=2e-4)


def test_report_cli(real_run: Path, tmp_path: Path, capsys) -> None:
    assert main(["report", str(real_run), "--out", str(tmp_path / "r"), "--max-steps", "2"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(tmp_path / "r" / "report.html")
    data = _embedded_data(Path(printed).read_text())
    assert [s["step"] for s in data["steps"]] == [1, 3]  # first and last kept
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_default_output_folder(real_run: Path) -> None:
    report = build_report(real_run)
    assert report.html == real_run / "report" / "report.html"
    assert report.html.stat().st_mode & 0o044, "report should be readable like any other file"


# ------------------------------------------------------------------------------ hand-written
def test_grpo_run_with_missing_series_and_null_signals(tmp_path: Path) -> None:
    samples = [sample(1, 0, 0.8, ["2", " +", " 2"]), sample(1, 0, -0.8, ["5"]),
               sample(2, 1, 0.0, ["x"])]
    run = write_run(tmp_path / "grpo", samples=samples)
    report = build_report(run)
    names = {path.stem for path in report.plots}
    assert names == {"reward", "heldout", "entropy", "step_time"}
    text = " ".join(report.skipped)
    assert "segment fraction" in text and "weights" in text
    page = report.html.read_text()
    assert 'id="top-tokens-empty"' in page and "computes none" in page
    data = _embedded_data(page)
    available = {s["key"]: s["available"] for s in data["signals"]}
    assert available == {"divergence": False, "normalized": False, "entropy": True,
                         "segment": False, "weight": False, "advantage": True}
    assert data["default_signal"] == "entropy"
    first, second = data["steps"]
    assert first["pairs"][0]["pos"]["tokens"] == ["2", " +", " 2"]
    assert first["pairs"][0]["neg"]["tokens"] == ["5"]
    # A group without contrast is still shown, on its own.
    assert second["pairs"][0]["pos"]["advantage"] == 0.0 and second["pairs"][0]["neg"] is None


HOSTILE_TEXTS = ("<!--<script>", "</script>", "<!--", "-->", "</SCRIPT >", "<!-- <script> x",
                 "</script/", "<script></script>", "<\\/script>", "\u2028\u2029", "&lt;&amp;",
                 "]]>", "<![CDATA[", "\x00\x7f\ud800")


class _Scripts(HTMLParser):
    """The page's ``<script>`` elements as the standard library's HTML tokenizer splits them:
    (attributes, text), in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._open = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts.append((dict(attrs), ""))
            self._open = True

    def handle_data(self, data: str) -> None:
        if self._open:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._open = False


def test_hostile_text_cannot_move_the_end_of_the_embedded_data(tmp_path: Path) -> None:
    """Logged text that looks like markup (``<!--<script>`` opens the tokenizer's "script data
    double escaped" state, where ``</script>`` no longer closes the element) is written without
    any ``<``, ``>`` or ``&``, so no text can change where the data element ends; the element's
    text parses back to exactly what was logged. The browser test renders the same texts."""
    text = "".join(HOSTILE_TEXTS)
    for hostile in (*HOSTILE_TEXTS, text):
        encoded = script_json({"t": hostile, hostile: [hostile]})
        assert not set(encoded) & set("<>&") and encoded.isascii(), encoded
        assert json.loads(encoded) == {"t": hostile, hostile: [hostile]}
    tokens = ["head", *HOSTILE_TEXTS]  # every hostile token above the threshold: top tokens
    pos = sample(1, 0, 1.0, tokens, prompt=f"user: {text}", answer=text, extracted=text,
                 problem_id=text, divergence=[0.0] + [1.0] * len(HOSTILE_TEXTS))
    run = write_run(tmp_path / "run", samples=[pos, sample(1, 0, -1.0, ["<!--<script>"])])
    page = build_report(run).html.read_text(encoding="utf-8")
    parser = _Scripts()
    parser.feed(page)
    parser.close()
    assert [attrs.get("id") for attrs, _ in parser.scripts] == ["report-data", None]
    data_text, viewer_text = parser.scripts[0][1], parser.scripts[1][1]
    assert viewer_text.strip() == SCRIPT.strip()
    assert f'<script type="application/json" id="report-data">{data_text}</script>' in page
    assert not set(data_text) & set("<>&")
    assert json.loads(data_text) == _json_safe(viewer_data(load_run(run)))
    (pair,) = json.loads(data_text)["steps"][0]["pairs"]
    assert pair["pos"]["tokens"] == tokens
    assert pair["prompt"] == f"user: {text}" and pair["answer"] == text == pair["problem_id"]
    assert pair["neg"]["tokens"] == ["<!--<script>"]
    # the top-tokens table shows them as text (a lone surrogate as its escape)
    cells = re.findall(r"<tr><td>\d+</td><td><code>(.*?)</code>", page)
    assert sorted(html.unescape(c) for c in cells) == sorted(
        json.dumps(t, ensure_ascii=False).replace("\ud800", "\\ud800") for t in tokens[1:])


def test_held_out_plot_has_every_k(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r"))
    plots, _ = training_curves(run)
    heldout = next(p for p in plots if p.name == "heldout")
    assert [line.get_label() for line in heldout.figure.axes[0].lines] == ["mean@2", "pass@2"]
    assert heldout.labels[0]["ylabel"] == "held-out accuracy"


def test_run_without_metrics_renders_with_notes(tmp_path: Path) -> None:
    run = write_run(tmp_path / "empty", metrics=[])
    report = build_report(run)
    assert report.plots == []
    assert len(report.skipped) == 6 + 1  # six curves, and the viewer (no samples)
    assert "No curves." in report.html.read_text()


def test_normalised_divergence_ignores_observation_tokens() -> None:
    record = sample(1, 0, 1.0, ["a", "b", "tool", "c"], divergence=[0.2, 0.6, 50.0, 0.4],
                    mask=[1, 1, 0, 1])
    assert normalized_divergence(record) == pytest.approx([0.0, 1.0, 0.0, 0.5])
    assert normalized_divergence(record, "max") == pytest.approx([1 / 3, 1.0, 0.0, 2 / 3])
    assert normalized_divergence(sample(1, 0, 1.0, ["a"])) is None


def test_top_tokens_counts_policy_tokens_above_threshold() -> None:
    samples = [
        sample(1, 0, 1.0, ["a", "b", "a", "c", "obs"], divergence=[0.0, 1.0, 0.5, 0.05, 9.0],
               mask=[1, 1, 1, 1, 0]),
        sample(1, 0, -1.0, ["a", "b", "d"], divergence=[1.0, 0.0, 0.3]),
        sample(2, 1, 1.0, ["a"]),  # no divergence: skipped
    ]
    rows = top_divergence_tokens(samples, threshold=0.1)
    # Most often above first; ties: the larger share of the token's occurrences first.
    assert [(r.token, r.above, r.total) for r in rows] == [("a", 2, 3), ("d", 1, 1),
                                                          ("b", 1, 2)]
    assert rows[0].mean_normalized == pytest.approx(0.75)
    assert top_divergence_tokens(samples, threshold=0.1, limit=1)[0].token == "a"
    with pytest.raises(ValueError, match="limit"):
        top_divergence_tokens(samples, limit=0)


def test_weight_spread_per_sign_and_step() -> None:
    samples = [sample(1, 0, 1.0, ["a", "b", "o"], weight=[1.0, 1.5, 0.0], mask=[1, 1, 0]),
               sample(1, 0, -1.0, ["c", "d"], weight=[0.5, 0.5]),
               sample(2, 0, 1.0, ["e"], weight=[1.2])]
    stats = weight_stats_by_step(samples)
    assert stats["pos"][1] == pytest.approx((1.25, 0.25))
    assert stats["neg"] == {1: (0.5, 0.0)}
    assert stats["pos"][2] == pytest.approx((1.2, 0.0))


def test_viewer_keeps_first_and_last_step() -> None:
    samples = [sample(s, 0, 1.0, ["a"]) for s in range(1, 11)]
    run = RunData(Path("x"), {}, [], samples)
    steps = [s["step"] for s in viewer_data(run, max_steps=3)["steps"]]
    assert steps[0] == 1 and steps[-1] == 10 and len(steps) == 3
    with pytest.raises(ValueError, match="max_steps"):
        viewer_data(run, max_steps=0)


@pytest.mark.parametrize(("content", "message"), [
    ('{"step": 1}\nnot json\n', r"samples.jsonl:2: not valid JSON"),
    ("[1, 2]\n", "expected a JSON object"),
    ('{"step": 1, "tokens": ["a", "b"], "mask": [1]}\n', "'mask' must be a list as long"),
    ('{"step": 1}\n', "no 'tokens' list"),
])
def test_malformed_samples_are_named(tmp_path: Path, content: str, message: str) -> None:
    run = write_run(tmp_path / "bad")
    (run / "samples.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        build_report(run)


def test_not_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a gear-rl run directory"):
        build_report(tmp_path)
    with pytest.raises(ValueError, match="threshold"):
        build_report(write_run(tmp_path / "r"), threshold=float("nan"))


# ------------------------------------------------------------------------------ what it imports
# ``gear-rl report`` reads files: it must not load the credit check, the trainer or the study
# (and with them transformers) to learn a file name. Checked in a fresh interpreter, after a
# whole report of a run that has a credit check.
_LOADED = """
import json, sys
from gear_rl.cli import main
assert main(["report", sys.argv[1], "--out", sys.argv[2]]) == 0
print(json.dumps(sorted(sys.modules)))
"""
_NEVER = ("gear_rl.credit_check", "gear_rl.train", "gear_rl.study", "transformers")


@pytest.fixture(scope="module")
def report_modules(tmp_path_factory) -> set[str]:
    """The modules loaded by ``gear-rl report RUN_DIR`` in a fresh interpreter."""
    folder = tmp_path_factory.mktemp("imports")
    run = write_run(folder / "run", samples=[sample(1, 0, 1.0, ["a", "b"])])
    (run / "credit_check").mkdir()
    (run / "credit_check" / "credit_check.json").write_text(json.dumps(
        {"settings": {"checkpoint_step": 3}, "trajectories": []}))
    done = subprocess.run([sys.executable, "-c", _LOADED, str(run), str(folder / "report")],
                          capture_output=True, text=True, timeout=600, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_report_never_loads_the_trainer_or_the_credit_check(report_modules: set[str]) -> None:
    loaded = sorted(m for m in report_modules if m.startswith(_NEVER))
    assert loaded == []


@pytest.mark.xfail(strict=True, reason="gear_rl.credit's __init__ imports its tensor estimators "
                   "(credit/batch.py: torch), and report/data.py reuses credit's GEAR normaliser "
                   "and defaults (credit.segments, credit.config); issue 38")
def test_report_never_loads_torch(report_modules: set[str]) -> None:
    assert "torch" not in report_modules


def test_ground_floor_modules_import_nothing_above_them() -> None:
    """rundir, stats and figures are the ground floor: report, study and the credit check
    import them, and they import nothing from the project but the ground floor itself (rundir,
    and for rundir's output-folder check and bounded readers dataclass_config and safe_json,
    which import nothing)."""
    code = ("import json, sys; import gear_rl.rundir, gear_rl.stats, gear_rl.figures; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gear_rl'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    assert json.loads(done.stdout) == ["gear_rl", "gear_rl.dataclass_config", "gear_rl.figures",
                                       "gear_rl.rundir", "gear_rl.safe_json", "gear_rl.stats"]
