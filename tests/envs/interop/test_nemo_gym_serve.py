"""Our envs as NeMo-Gym resources servers (``relax-gym envs serve ID --protocol nemo-gym``), played as NeMo-Gym's
``simple_agent`` plays one: ``/seed_session`` with the task row, each function call posted to its route with the
session cookie, the rollout (a Responses API response) sent to ``/verify``. NeMo-Gym itself does not install from
the package index, so its side is that sequence from its agent's source, spoken with httpx, and our ``nemo-gym:``
adapter (which speaks the protocol from its docs). The task rows carry the media decoded and inline (Responses API
parts), asserted on what the rows hold."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import soundfile
from PIL import Image
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs import check_env
from relax_gym.envs.interop.nemo_gym_serve import COOKIE, build_app, task_rows, write_rows
from relax_gym.omni.tool_calls import parse_tool_calls

from .test_nemo_gym_env import serve


def _pixels(url: str) -> tuple[int, int]:
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size


def _media(row: dict) -> dict[str, list]:
    """What a NeMo-Gym agent hands its model: frame timestamps, image sizes, audio sample counts."""
    found: dict[str, list] = {"frames_at": [], "images": [], "audio": []}
    for message in row["responses_create_params"]["input"]:
        for part in message["content"]:
            if part["type"] == "input_text" and part["text"].startswith("[video frame at "):
                found["frames_at"].append(float(part["text"].split(" at ")[1].split(" s]")[0]))
            elif part["type"] == "input_image":
                found["images"].append(_pixels(part["image_url"]))
            elif part["type"] == "input_audio":
                samples, rate = soundfile.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])))
                found["audio"].append((len(samples), rate))
    return found


@pytest.fixture(scope="module")
def rows():
    return {env_id: task_rows(env_id, 3) for env_id in ("nextqa-video", "echo-ink-agent")}


def test_task_rows_carry_each_medium_decoded_and_the_tools(rows):
    video = _media(rows["nextqa-video"][0])
    assert len(video["frames_at"]) >= 8 and video["frames_at"] == sorted(video["frames_at"])
    assert len(video["images"]) == len(video["frames_at"]) and all(min(size) > 0 for size in video["images"])
    agent = rows["echo-ink-agent"][0]
    media = _media(agent)
    assert media["images"] and min(media["images"][0]) > 0 and media["audio"] and media["audio"][0][0] > 0
    assert [t["name"] for t in agent["responses_create_params"]["tools"]] == ["listen", "zoom"]
    assert all(t["type"] == "function" and t["parameters"]["type"] == "object"
               for t in agent["responses_create_params"]["tools"])
    assert [r["relax_seed"] for r in rows["echo-ink-agent"]] == [0, 1, 2]


def _play_like_simple_agent(url: str, row: dict) -> dict:
    """NeMo-Gym's simple_agent with a model that says the row's gold actions: seed, tools, verify."""
    with httpx.Client(base_url=url, timeout=120) as http:
        assert http.post("/seed_session", json=row).status_code == 200
        output = []
        for n, action in enumerate(row["relax_gold"]):
            calls = parse_tool_calls(action)
            if not calls:
                output.append({"type": "message", "role": "assistant", "id": f"msg_{n}", "status": "completed",
                               "content": [{"type": "output_text", "text": action, "annotations": []}]})
                break
            for k, call in enumerate(calls):
                reply = http.post(f"/{call.name}", json=call.arguments)
                assert reply.status_code == 200, reply.text
                result = reply.json()
                assert set(result) == {"output", "media", "reward", "done"} and result["done"] is False
                output += [{"type": "function_call", "call_id": f"c{n}{k}", "name": call.name,
                            "arguments": str(call.arguments)},
                           {"type": "function_call_output", "call_id": f"c{n}{k}", "output": reply.text}]
        verdict = http.post("/verify", json={**row, "response": {"output": output}})
        assert verdict.status_code == 200, verdict.text
        return verdict.json()


@pytest.mark.parametrize("env_id", ["nextqa-video", "echo-ink-agent"])
def test_a_simple_agent_run_of_the_gold_actions_gets_the_episodes_return(rows, env_id):
    server, url = serve(build_app(env_id))
    try:
        for row in rows[env_id]:
            env = relax_gym.make(env_id)
            _, info = env.reset(seed=row["relax_seed"])
            expected = 0.0
            for action in row["relax_gold"]:  # the same play in-process
                _, reward, terminated, truncated, _ = env.step(action)
                expected += reward
            env.close()
            verdict = _play_like_simple_agent(url, row)
            assert verdict["reward"] == pytest.approx(expected) and expected > 0
            assert verdict["relax_status"] == "ok" and verdict["relax_seed"] == row["relax_seed"]
    finally:
        server.should_exit = True


def test_our_nemo_gym_adapter_plays_our_resources_server_with_its_media(rows, tmp_path):
    path = tmp_path / "echo-ink-agent.jsonl"
    write_rows(str(path), rows["echo-ink-agent"])
    server, url = serve(build_app("echo-ink-agent"))
    try:
        turns = len(rows["echo-ink-agent"][0]["relax_gold"])
        assert all(len(r["relax_gold"]) == turns for r in rows["echo-ink-agent"])
        env = relax_gym.make(f"nemo-gym:{url}", data_file=str(path), gold=[f"{{relax_gold[{t}]}}" for t in range(turns)],
                             reward_bounds=(0.0, 1.0))
        report = check_env(env)
        assert "gold action => max reward" in report.passed
        obs, info = env.reset(seed=0)
        kinds = {part.kind for message in obs for part in message.content}
        assert {"image", "audio"} <= kinds  # the adapter got the picture and the sound as parts
        image = next(p for m in obs for p in m.content if p.kind == "image").decode()
        assert image.ndim == 3 and np.asarray(image).std() > 0
        env.close()
    finally:
        server.should_exit = True


def test_wrong_calls_get_one_clear_error(rows):
    server, url = serve(build_app("echo-ink-agent"))
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            no_session = http.post("/zoom", json={"x": 0, "y": 0, "w": 8, "h": 8})
            assert no_session.status_code == 400 and "POST /seed_session first" in no_session.json()["error"]
            http.post("/seed_session", json=rows["echo-ink-agent"][0])
            unknown = http.post("/search", json={})
            assert unknown.status_code == 404 and unknown.json()["error"] == "no tool 'search' here (tools: listen, zoom)"
            assert http.post("/zoom", content=b"{not json").json()["error"] == "POST /zoom: the body is not JSON"
            bad_seed = http.post("/seed_session", json={"relax_seed": "one"})
            assert bad_seed.status_code == 422 and "relax_seed must be an integer" in bad_seed.json()["error"]
    finally:
        server.should_exit = True


def test_the_cli_serves_loopback_only():
    result = CliRunner().invoke(app, ["envs", "serve", "echo-ink", "--protocol", "nemo-gym", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--protocol nemo-gym serves loopback only" in result.output
