"""`relax-gym view`'s app (relax_gym/viewer) through Starlette's TestClient: the page and its static files, the JSON
API over a run directory (metrics, steps, a step's records and their filters) and the media files it serves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from relax_gym.cli import app as cli
from relax_gym.omni import AudioPart, ImagePart, Message, TextPart, VideoPart
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.run.rollout_records import RolloutRecorder, step_file
from relax_gym.viewer.app import STATIC_DIR, make_app


def _traj(seed: int, reward: float, status: str = "ok", *, tool: str | None = None) -> Trajectory:
    rng = np.random.default_rng(seed)
    media = (VideoPart.of(rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8), fps_of_array=4.0),
             AudioPart.of(np.zeros(1600, np.float32), rate_of_array=16000),
             ImagePart.of(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)))
    reply = f'<tool_call>{{"name": "{tool}", "arguments": {{}}}}</tool_call>' if tool else "<answer>A</answer>"
    traj = Trajectory(group_id=seed // 2, seed=seed, reward=reward, status=status, turns=1, weight_versions=["1"])
    traj.conversation = [Message("user", (TextPart("question"), *media)), Message("assistant", reply)]
    if tool:
        traj.conversation.append(Message("tool", "<tool_response>\nok\n</tool_response>", name=tool))
    return traj


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": {"id": "nextqa-video-agent"}, "algorithm": {"name": "grpo"},
                                                 "trainer": {"mode": "colocate", "steps": 2, "group_size": 2}}))
    rows = [{"step": -1, "sft_nll": 1.0}, {"step": 0, "eval_reward": 0.2}, {"step": 1, "reward_mean": 0.4, "time_step_s": 2.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "rew')  # mid-write
    recorder = RolloutRecorder(run, per_step=4, media_mb=16)
    recorder.write(0, "eval", [_traj(0, 0.0)])
    recorder.write(1, "train", [_traj(0, 1.0, tool="watch"), _traj(1, 0.5), _traj(2, 0.0, "env_error"), _traj(3, 0.25, tool="frame")])
    recorder.write(1, "eval", [_traj(0, 0.1, tool="watch")])
    return run


@pytest.fixture
def client(run_dir: Path) -> TestClient:
    return TestClient(make_app(run_dir))


def test_page_and_static_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/static/app.js" in page.text and "/static/style.css" in page.text
    assert "http://" not in page.text and "https://" not in page.text, "the page loads nothing from the network"
    script = client.get("/static/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    assert {p.name for p in STATIC_DIR.iterdir()} >= {"index.html", "app.js", "style.css"}


def test_run_and_metrics(client, run_dir):
    run = client.get("/api/run").json()
    assert (run["name"], run["env"], run["algorithm"], run["finished"]) == ("run", "nextqa-video-agent", "grpo", False)
    assert [r["step"] for r in client.get("/api/metrics").json()] == [-1, 0, 1], "the line being written is left out"
    (run_dir / "summary.json").write_text(json.dumps({"steps": 2}))
    assert client.get("/api/run").json()["finished"] is True


def test_steps_list_what_each_step_holds(client):
    steps = client.get("/api/steps").json()
    assert [s["step"] for s in steps] == [0, 1]
    one = steps[1]
    assert (one["train"], one["eval"]) == (4, 1) and one["train_reward"] == pytest.approx(0.4375)
    assert one["statuses"] == ["env_error", "ok"] and one["tools"] == ["frame", "watch"]
    assert steps[0]["train"] == 0 and steps[0]["train_reward"] is None


def test_a_step_s_records_and_filters(client):
    records = client.get("/api/steps/1").json()
    assert [(r["kind"], r["index"]) for r in records] == [("train", 0), ("train", 1), ("train", 2), ("train", 3), ("eval", 0)]

    def indices(query: str) -> list[tuple[str, int]]:
        return [(r["kind"], r["index"]) for r in client.get(f"/api/steps/1?{query}").json()]

    assert indices("kind=eval") == [("eval", 0)]
    assert indices("tool=watch") == [("train", 0), ("eval", 0)]
    assert indices("tool=none") == [("train", 1), ("train", 2)]
    assert indices("status=env_error") == [("train", 2)]
    assert indices("reward_min=0.2&reward_max=0.6&kind=train") == [("train", 1), ("train", 3)]
    assert client.get("/api/steps/1?reward_min=lots").status_code == 400
    assert client.get("/api/steps/9").status_code == 404


def test_a_record_written_again_replaces_the_first(client, run_dir):
    """A resumed run replays the steps after its checkpoint: the viewer keeps the latest record of each episode."""
    RolloutRecorder(run_dir, per_step=4, media_mb=16).write(1, "train", [_traj(0, 0.9)])
    assert len(step_file(run_dir, 1).read_text().splitlines()) == 6
    records = client.get("/api/steps/1?kind=train").json()
    assert len(records) == 4 and records[0]["reward"] == 0.9


def test_media_files_are_served_with_their_types(client):
    (record,) = client.get("/api/steps/0").json()
    parts = {p["type"]: p for p in record["messages"][0]["parts"][1:]}
    for kind, mime in (("video", "video/webm"), ("audio", "audio/wav"), ("image", "image/png")):
        response = client.get("/" + parts[kind]["url"])
        assert response.status_code == 200 and response.headers["content-type"] == mime, kind
        assert len(response.content) == parts[kind]["bytes"]
    ranged = client.get("/" + parts["video"]["url"], headers={"Range": "bytes=0-9"})
    assert ranged.status_code == 206 and len(ranged.content) == 10, "browsers seek in a video with range requests"


@pytest.mark.parametrize("path", ["/media/../config.json", "/media/%2e%2e/config.json", "/media/..%2Fconfig.json",
                                  "/media/nothing.webm", "/media/"])
def test_media_outside_the_media_folder_are_refused(client, path):
    assert client.get(path).status_code == 404


def test_an_empty_run_directory_is_a_page_with_nothing_yet(tmp_path):
    client = TestClient(make_app(tmp_path))
    assert client.get("/api/steps").json() == [] and client.get("/api/metrics").json() == []
    assert client.get("/api/run").json()["finished"] is False


def test_view_command_checks_its_run_dir(tmp_path):
    result = CliRunner().invoke(cli, ["view", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "is not a directory" in " ".join(result.output.split())
    help_text = CliRunner().invoke(cli, ["view", "--help"]).output
    assert "--port" in help_text and "--host" in help_text
