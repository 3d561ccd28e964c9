"""The acceptance test of `relax-gym view`: short real training runs, the viewer started on each as a user would
(`relax-gym view RUN_DIR --port 0`, on loopback), and the page driven in headless Chromium over the DevTools
protocol (a websocket on Chromium's loopback debugging port; no browser-automation package).

- nextqa-video-agent (video, images, tools): the SFT warm-up imitates the env's gold plan, so the policy's own
  train rollouts call ``watch`` and get a video back; the page shows the step list, a train rollout's tool call set
  apart, its video playing in Chromium (VP8 WebM decoded: a frame size and a duration), every media URL loading
  with its content type, two steps side by side, a filter, and a step the run writes later appearing by itself.
- echo-ink-agent (image and audio in the first observation, tools): an ``<audio>`` element whose WAV Chromium reads.

A screenshot of each page is saved under the test's tmp folder (the path is printed; docs/img/viewer.png is one).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner
from websockets.sync.client import connect

from relax_gym.cli import app

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.base=null", "trainer.steps=1", "trainer.eval_every=1", "trainer.eval_episodes=2", "metrics.tensorboard=false",
         "trainer.prompts_per_step=2", "trainer.group_size=2", "metrics.rollouts_per_step=4"]
# the warm-up (lr 6e-4 for a short one) teaches the gold plan's watch call; sampling at 0.5 keeps it in the rollouts
VIDEO_RUN = ["recipes/cpu-nextqa-agent.yaml", *SMALL, "trainer.sft_warmup_steps=20", "trainer.sft_batch_size=8",
             "actor.lr=6e-4", "inference.temperature=0.5", "algorithm.temperature=0.5"]
# the image and the first second of audio are in every first observation: no warm-up needed
AUDIO_RUN = ["recipes/cpu-echo-ink.yaml", *SMALL, "env.id=echo-ink-agent", "env.eval_kwargs={split: valid}",
             "trainer.sft_warmup_steps=0", "trainer.eval_episodes=1"]


def train(tmp_path: Path, args: list[str], name: str) -> Path:
    run_dir = tmp_path / name
    recipe, *overrides = args
    result = CliRunner().invoke(app, ["train", str(REPO / recipe), *overrides, "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "rollouts" / "step_000001.jsonl").is_file()
    return run_dir


class Viewer:
    """`relax-gym view RUN_DIR --port 0` in a child process; ``url`` is the one it prints."""

    def __init__(self, run_dir: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "relax_gym.cli", "view", str(run_dir), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(self.proc.stdout.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while not any("http://" in line for line in lines):
            assert self.proc.poll() is None, f"relax-gym view exited: {''.join(lines)}"
            assert time.monotonic() < deadline, f"relax-gym view printed no URL: {''.join(lines)}"
            time.sleep(0.1)
        self.url = next(w for line in lines for w in line.split() if w.startswith("http://")).rstrip("/")
        assert self.url.startswith("http://127.0.0.1:")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Browser:
    """Headless Chromium with its DevTools endpoint on loopback, and one page driven over its websocket."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--mute-audio",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--no-first-run", "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-extensions", "--window-size=1400,1100", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert self.proc.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium opened no DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        self._open = contextlib.ExitStack()
        self.ws = self._open.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30))
        self.n = 0
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=1100, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:  # events are not enabled; anything else is skipped
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.n:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, f"{expression}: {result['exceptionDetails']}"
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = ""):
        deadline = time.monotonic() + timeout
        while not (value := self.eval(expression)):
            assert time.monotonic() < deadline, f"timed out waiting for {what or expression}"
            time.sleep(0.25)
        return value

    def screenshot(self, path: Path) -> Path:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print(f"viewer screenshot: {path}")
        return path

    def close(self) -> None:
        try:
            self._open.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install --no-install-recommends chromium; .ci/run does)")
    return binary


def open_page(chromium: str, run_dir: Path, profile: Path) -> tuple[Viewer, Browser]:
    viewer = Viewer(run_dir)
    try:
        browser = Browser(chromium, profile)
    except BaseException:
        viewer.close()
        raise
    browser.call("Page.navigate", url=viewer.url + "/")
    browser.wait_for("document.body && document.body.dataset.loaded === 'true' && "
                     "document.querySelectorAll('#pane-a .rollout').length > 0", what="the page and its first step")
    return viewer, browser


def media_sources(browser: Browser, selector: str) -> list[tuple[str, str]]:
    return browser.eval(f"[...document.querySelectorAll({selector!r})].map(e => [e.tagName.toLowerCase(), e.src])")


def check_media_urls(sources: list[tuple[str, str]]) -> None:
    """Each media URL the page shows answers 200 with the content type its element plays."""
    expected = {"video": ("video/webm",), "audio": ("audio/wav",), "img": ("image/png", "image/jpeg")}
    assert sources
    for url, tag in {url: tag for tag, url in sources}.items():  # one request per URL
        response = httpx.get(url, timeout=30)
        assert response.status_code == 200, url
        assert response.headers["content-type"] in expected[tag], (url, response.headers["content-type"])
        assert len(response.content) > 0, url


def element_ready(kind: str) -> str:
    """JS: the first <video>/<audio> of pane A has loaded its metadata (Chromium decoded the file's header)."""
    return (f"(() => {{ const m = document.querySelector('#pane-a .rollout {kind}'); if (!m) return false;"
            f" if (m.readyState === 0) {{ m.load(); return false; }}"
            f" return m.readyState >= 1 && m.duration > 0 {'&& m.videoWidth > 0' if kind == 'video' else ''}; }})()")


@pytest.mark.slow(reason="records a video agent run, then drives the viewer page in headless Chromium")
@pytest.mark.timeout(900)
def test_viewer_page_on_a_video_agent_run(tmp_path, chromium):
    check_video_run_page(train(tmp_path, VIDEO_RUN, "video-run"), chromium, tmp_path)


def check_video_run_page(run_dir: Path, chromium: str, tmp_path: Path) -> None:
    """The checks of the video run's page (a function of its own so a run made by hand can be checked too)."""
    viewer, browser = open_page(chromium, run_dir, tmp_path / "chromium-profile")
    try:
        steps = browser.eval("[...document.querySelectorAll('#step-list li[data-step]')].map(li => Number(li.dataset.step))")
        assert steps == [0, 1], "step 0: the first eval; step 1: the RL step"
        calls = browser.eval("[...document.querySelectorAll('#pane-a .rollout.kind-train .tool-call:not(.bad)')]"
                             ".map(c => c.textContent)")
        records = [json.loads(line) for line in (run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
        said = [p.get("text") or p.get("name") for r in records if r["kind"] == "train" for m in r["messages"]
                if m["role"] == "assistant" for p in m["parts"]]
        assert calls, f"no train rollout of the warmed-up policy shows a tool call; its replies: {said}"
        assert any("watch" in c for c in calls), calls
        browser.wait_for(element_ready("video"), what="Chromium to read a rollout's WebM")
        assert browser.eval("document.querySelectorAll('#pane-a .rollout .msg.role-tool').length") > 0
        check_media_urls(media_sources(browser, "#pane-a video, #pane-a img, #pane-a audio"))
        shot = browser.screenshot(tmp_path / "viewer-video-run.png")
        assert shot.stat().st_size > 20_000
        if os.environ.get("RELAX_GYM_VIEWER_SHOT"):  # docs/img/viewer.png is made this way
            shutil.copy(shot, os.environ["RELAX_GYM_VIEWER_SHOT"])

        # two steps side by side
        browser.eval("document.querySelector('#step-list li[data-step=\"0\"] button').click()")
        browser.wait_for("!document.querySelector('#pane-b').hidden && "
                         "document.querySelectorAll('#pane-b .rollout.kind-eval').length === 2", what="step 0 in pane B")
        # a filter: eval episodes only
        browser.eval("(() => { const s = document.querySelector('#f-kind'); s.value = 'eval';"
                     " s.dispatchEvent(new Event('change')); })()")
        browser.wait_for("(() => { const r = [...document.querySelectorAll('#pane-a .rollout')];"
                         " return r.length > 0 && r.every(x => x.classList.contains('kind-eval')); })()", what="the kind filter")
        # a step the run writes later shows up by itself (the page polls)
        later = (run_dir / "rollouts" / "step_000001.jsonl").read_text().replace('"step": 1,', '"step": 2,')
        (run_dir / "rollouts" / "step_000002.jsonl").write_text(later)
        browser.wait_for("document.querySelector('#step-list li[data-step=\"2\"]') !== null", timeout=30,
                         what="the new step in the list")
    finally:
        browser.close()
        viewer.close()


@pytest.mark.slow(reason="records an image and audio agent run, then drives the viewer page in headless Chromium")
@pytest.mark.timeout(600)
def test_viewer_page_on_an_image_and_audio_agent_run(tmp_path, chromium):
    check_audio_run_page(train(tmp_path, AUDIO_RUN, "audio-run"), chromium, tmp_path)


def check_audio_run_page(run_dir: Path, chromium: str, tmp_path: Path) -> None:
    viewer, browser = open_page(chromium, run_dir, tmp_path / "chromium-profile")
    try:
        assert browser.eval("document.querySelectorAll('#step-list li[data-step]').length") == 2
        browser.wait_for(element_ready("audio"), what="Chromium to read a rollout's WAV")
        assert browser.eval("document.querySelectorAll('#pane-a .rollout img').length") > 0
        check_media_urls(media_sources(browser, "#pane-a audio, #pane-a img"))
        browser.screenshot(tmp_path / "viewer-audio-run.png")
    finally:
        browser.close()
        viewer.close()
