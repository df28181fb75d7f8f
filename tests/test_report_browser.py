"""The report page in a real headless Chromium, driven over the DevTools protocol: it loads
offline (every request is file: or data:), the curves decode, switching the colouring signal
recolours the tokens, hovering a token shows its numbers, and a screenshot is a non-blank PNG.

Chromium comes from Debian's package (``scripts/setup_browser.sh``, run by ``scripts/test.sh``);
``GEAR_RL_CHROMIUM`` may name another binary. Without a browser this test fails, it does not
skip: a report nobody has seen render is not tested.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image, ImageStat
from websockets.sync.client import connect

from gear_rl.report import build_report
from test_report import sample, write_run

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--disable-background-networking", "--window-size=1280,1400"]


def chromium_binary() -> str:
    candidates = [os.environ.get("GEAR_RL_CHROMIUM", ""), "chromium", "chromium-browser",
                  "google-chrome"]
    for name in candidates:
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.fail("no Chromium found for the report's browser test: run scripts/setup_browser.sh "
                "(apt-get install chromium) or set GEAR_RL_CHROMIUM to a Chrome/Chromium binary")


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, socket) -> None:
        self.socket = socket
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, timeout: float = 20.0, **params) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.js(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {expression}")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def page_file(tmp_path_factory) -> Path:
    """A GEAR-style run whose numbers the test knows: an observation token with a huge
    divergence (must not move the normalisation), one segment per trajectory."""
    root = tmp_path_factory.mktemp("browser")
    pos = sample(1, 0, 1.2, ["Two", " plus", " two", "<tool>", " is", " 4"],
                 divergence=[0.1, 0.5, 0.3, 9.0, 0.7, 0.2], mask=[1, 1, 1, 0, 1, 1],
                 entropy=[2.0, 1.0, 0.5, 0.0, 0.4, 0.3],
                 segment_onset=[-1, 1, 1, -1, -1, -1],
                 weight=[0.9, 0.6, 0.6, 0.0, 0.5, 0.85],
                 token_advantage=[1.08, 0.72, 0.72, 0.0, 0.6, 1.02],
                 student_logprobs=[-1.0] * 6, teacher_logprobs=[-1.5] * 6)
    neg = sample(1, 0, -1.2, ["It", " is", " 5", "\n"], divergence=[0.2, 0.1, 0.8, 0.05],
                 entropy=[1.5, 0.2, 0.9, 0.1], segment_onset=[-1, -1, 2, 2],
                 weight=[0.6, 0.5, 1.5, 1.5], token_advantage=[-0.72, -0.6, -1.8, -1.8])
    run = write_run(root / "run", estimator="gear", samples=[pos, neg])
    return build_report(run, root / "out").html


@pytest.fixture(scope="module")
def browser(page_file: Path, tmp_path_factory):
    binary = chromium_binary()
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen([binary, *FLAGS, "--remote-debugging-port=0",
                                f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if process.poll() is not None:
                pytest.fail(f"{binary} exited with {process.returncode}: "
                            f"{process.stderr.read().decode(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"{binary} did not open its DevTools port within 30 s")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            targets = json.loads(reply.read())
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20) as socket:
            tools = DevTools(socket)
            tools.send("Network.enable")
            tools.send("Page.enable")
            tools.send("Runtime.enable")
            tools.send("Page.navigate", url=page_file.as_uri())
            tools.wait_for("document.readyState === 'complete' && document.body && "
                           "document.body.dataset.ready === '1'")
            yield tools
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_page_loads_offline_with_its_parts(browser: DevTools) -> None:
    requests = [e["params"]["request"]["url"] for e in browser.events
                if e.get("method") == "Network.requestWillBeSent"]
    assert requests, "no request was seen at all"
    assert all(url.startswith(("file:", "data:")) for url in requests), requests
    errors = [e["params"] for e in browser.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled"
                  and e["params"].get("type") == "error")]
    assert not errors, errors
    signals = browser.js("[...document.querySelectorAll('#signal option')].map(o => o.value)")
    assert signals == ["divergence", "normalized", "entropy", "segment", "weight", "advantage"]
    assert browser.js("document.getElementById('signal').value") == "normalized"
    curves = browser.js("[...document.querySelectorAll('img.curve')]"
                        ".map(i => [i.dataset.name, i.naturalWidth > 100 && i.complete])")
    assert [name for name, _ in curves] == ["reward", "heldout", "entropy", "weights",
                                            "step_time"]
    assert all(ok for _, ok in curves), curves
    assert browser.js("document.querySelectorAll('#traj-pos .tok').length") == 6
    assert browser.js("document.querySelectorAll('#traj-neg .tok').length") == 4
    assert browser.js("document.querySelectorAll('#traj-pos .tok.obs').length") == 1
    # One outlined span per segment, holding exactly that segment's tokens.
    assert browser.js("[...document.querySelectorAll('#traj-pos .seg')]"
                      ".map(s => s.textContent)") == [" plus two"]
    assert browser.js("[...document.querySelectorAll('#traj-neg .seg')]"
                      ".map(s => s.querySelectorAll('.tok').length)") == [2]
    assert browser.js("getComputedStyle(document.querySelector('#traj-pos .seg'))"
                      ".outlineStyle") == "solid"
    assert browser.js("getComputedStyle(document.querySelector('#traj-pos .tok.obs')).color"
                      ) == "rgb(160, 160, 166)"
    assert browser.js("document.querySelectorAll('#top-tokens tbody tr').length") > 0


def _background(browser: DevTools, side: str, index: int) -> str:
    return browser.js(f"getComputedStyle(document.querySelector("
                      f"'#traj-{side} .tok[data-i=\"{index}\"]')).backgroundColor")


def test_switching_the_signal_recolours_tokens(browser: DevTools) -> None:
    # Normalised divergence over policy tokens of the positive row: (d - 0.1) / 0.6, so the
    # first token ("Two", n = 0) is the palest and " is" (n = 1) the deepest orange.
    faint, deep = _background(browser, "pos", 0), _background(browser, "pos", 4)
    assert faint.startswith("rgba(230, 85, 13") and deep.startswith("rgba(230, 85, 13")
    assert float(deep.rsplit(",", 1)[1].rstrip(")")) > 0.85
    assert float(faint.rsplit(",", 1)[1].rstrip(")")) < 0.1

    browser.js("(() => { const s = document.getElementById('signal'); s.value = 'advantage';"
               " s.dispatchEvent(new Event('change')); })()")
    assert browser.js("document.body.dataset.signal") == "advantage"
    assert _background(browser, "pos", 0).startswith("rgba(26, 150, 65")  # green: A > 0
    assert _background(browser, "neg", 2).startswith("rgba(215, 48, 39")  # red: A < 0
    assert "Ahat_t" in browser.js("document.getElementById('legend').textContent")

    browser.js("(() => { const s = document.getElementById('signal'); s.value = 'segment';"
               " s.dispatchEvent(new Event('change')); })()")
    inside, outside = _background(browser, "pos", 1), _background(browser, "pos", 0)
    assert inside != outside and outside == "rgba(0, 0, 0, 0)"


def _hover(browser: DevTools, selector: str) -> None:
    """Scroll the element into view and move the real mouse pointer onto its centre."""
    x, y = browser.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                      " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                      " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)


def test_hover_shows_the_numbers(browser: DevTools, tmp_path: Path) -> None:
    _hover(browser, "#traj-pos .tok[data-i='4']")
    browser.wait_for("document.getElementById('tooltip').style.display === 'block'", 5)
    cells = browser.js("Object.fromEntries([...document.querySelectorAll('#tooltip td[data-key]')]"
                       ".map(td => [td.dataset.key, td.textContent]))")
    assert cells["token"] == '" is"'
    assert cells["index"] == "4" and cells["kind"] == "policy"
    assert cells["divergence"] == "0.7000"
    assert cells["normalised divergence"] == "1.0000"
    assert cells["entropy"] == "0.4000"
    assert cells["weight"] == "0.5000" and cells["final advantage"] == "0.6000"
    assert cells["student log p"] == "-1.0000" and cells["teacher log p"] == "-1.5000"

    # The observation token says so, and its huge divergence was not part of the min-max.
    _hover(browser, "#traj-pos .tok.obs")
    browser.wait_for("document.querySelector('#tooltip td[data-key=\"kind\"]').textContent"
                     " === 'observation'", 5)
    assert browser.js("document.querySelector('#tooltip td[data-key=\"normalised divergence\"]')"
                      ".textContent") == "0.0000"

    shot = base64.b64decode(browser.send("Page.captureScreenshot", format="png")["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "report.png").write_bytes(shot)
    with Image.open(io.BytesIO(shot)) as image:
        assert image.size == (1280, 1400) or image.size[0] >= 800
        rgb = image.convert("RGB")
        assert max(ImageStat.Stat(rgb).stddev) > 20, "screenshot is blank"
        assert len(rgb.getcolors(maxcolors=1 << 20) or []) > 100

    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=2, y=2)
    browser.wait_for("document.getElementById('tooltip').style.display === 'none'", 5)


def test_credit_check_entry_colours_by_the_monte_carlo_advantage(browser: DevTools,
                                                                  tmp_path: Path) -> None:
    """A run holding a credit check (``credit_check/credit_check.json``): its trajectories are
    the last Step entry, and the Monte-Carlo advantage colours their tokens by sign."""

    def trajectory(row: int, advantage: float, tokens: list[str], mc: list[float]) -> dict:
        n = len(tokens)
        return {"row": row, "group": 0, "problem_id": "p0", "prompt": "q", "answer": "4",
                "response": "".join(tokens), "extracted": "4", "reward": float(advantage > 0),
                "advantage": advantage, "finished": True, "tokens": tokens,
                "token_ids": list(range(n)), "mask": [1] * n, "entropy": [1.0] * n,
                "divergence": [0.1] * n, "student_logprobs": [-1.0] * n,
                "teacher_logprobs": [-1.2] * n, "segment_onset": [-1] * n,
                "mc_advantage": mc, "advantages": {"gear": [advantage] * n},
                "run_estimator": "gear"}

    run = write_run(tmp_path / "run", estimator="gear",
                    samples=[sample(1, 0, 1.0, ["a"]), sample(1, 0, -1.0, ["b"])])
    (run / "credit_check").mkdir()
    (run / "credit_check" / "credit_check.json").write_text(json.dumps({
        "settings": {"checkpoint_step": 5},
        "trajectories": [trajectory(0, 0.8, ["4", " x", " 2"], [0.5, -0.25, 0.0]),
                         trajectory(1, -0.8, ["5"], [-0.6])]}))
    page = build_report(run, tmp_path / "out").html
    browser.send("Page.navigate", url=page.as_uri())
    browser.wait_for("document.readyState === 'complete' && document.body && "
                     "document.body.dataset.ready === '1' && "
                     "document.querySelectorAll('#step option').length === 2")
    labels = browser.js("[...document.querySelectorAll('#step option')].map(o => o.textContent)")
    assert labels == ["step 1", "credit check (checkpoint step 5)"]
    assert "mc_advantage" in browser.js(
        "[...document.querySelectorAll('#signal option')].map(o => o.value)")
    browser.js("(() => { const s = document.getElementById('step'); s.value = '1';"
               " s.dispatchEvent(new Event('change'));"
               " const g = document.getElementById('signal'); g.value = 'mc_advantage';"
               " g.dispatchEvent(new Event('change')); })()")
    assert browser.js("document.body.dataset.signal") == "mc_advantage"
    assert browser.js("document.querySelectorAll('#traj-pos .tok').length") == 3
    assert _background(browser, "pos", 0).startswith("rgba(26, 150, 65")  # MC advantage > 0
    assert _background(browser, "pos", 1).startswith("rgba(215, 48, 39")  # < 0
    assert _background(browser, "neg", 0).startswith("rgba(215, 48, 39")
    assert "from the credit check" in browser.js(
        "document.getElementById('legend').textContent")


HOSTILE_TEXTS = ("<!--<script>", "</script>", "<!--", "-->", "</SCRIPT >", "<!-- <script> x",
                 "</script/", "<script></script>", "<\\/script>", "\u2028\u2029", "&lt;&amp;")


def test_hostile_logged_text_cannot_move_the_end_of_the_data(browser: DevTools,
                                                             tmp_path: Path) -> None:
    """Text the model or the task wrote (tokens, prompt, answer, extracted answer) that looks
    like markup, ``<!--<script>`` above all (which in script data opens the "double escaped"
    state, where ``</script>`` no longer ends the element): the data element must end where the
    page put its end, its text must parse back to exactly what was logged, and the viewer must
    draw every token."""
    tokens = [*HOSTILE_TEXTS, "<!--<script>", " tail"]
    text = "".join(HOSTILE_TEXTS)
    pos = sample(1, 0, 1.0, tokens, prompt=f"user: {text}", answer=text, extracted=text)
    neg = sample(1, 0, -1.0, ["<!--<script>", "5"])
    run = write_run(tmp_path / "run", estimator="gear", samples=[pos, neg])
    page = build_report(run, tmp_path / "out").html
    browser.send("Page.navigate", url=page.as_uri())
    browser.wait_for(f"location.href === {json.dumps(page.as_uri())} && "
                     "document.readyState === 'complete' && document.body && "
                     "document.body.dataset.ready === '1'")
    # the page's two scripts, the data then the viewer, and nothing swallowed into the data
    assert browser.js("[...document.scripts].map(s => s.id || s.type || 'viewer')") == [
        "report-data", "viewer"]
    embedded = json.loads(browser.js("document.getElementById('report-data').textContent"))
    (pair,) = embedded["steps"][0]["pairs"]
    assert pair["pos"]["tokens"] == tokens and pair["neg"]["tokens"] == ["<!--<script>", "5"]
    assert pair["prompt"] == f"user: {text}" and pair["answer"] == text
    assert pair["pos"]["extracted"] == text
    assert browser.js("[...document.querySelectorAll('#traj-pos .tok')]"
                      ".map(t => t.textContent)") == tokens
    assert browser.js("document.querySelectorAll('#traj-neg .tok').length") == 2
    assert browser.js("document.getElementById('problem').textContent").endswith(text)
    assert browser.js("document.querySelectorAll('#top-tokens, #top-tokens-empty').length") == 1
