"""A NeMo-Gym resources server as a relax-gym env. NeMo-Gym is not on the package index, so the server is written
here as its docs describe one (Starlette under uvicorn on loopback): ``POST /seed_session`` starts a session under a
cookie, ``POST /get_weather`` is the task's tool, ``POST /verify`` scores the rollout, sent as a Responses API
response. ``relax_gym.make("nemo-gym:URL", data_file=...)`` on tasks in NeMo-Gym's JSONL layout passes check_env
(a tool call, then the answer), keeps the server's session across the turns, trains three colocate steps, and a
route that fails ends the episode as an ``env_error`` naming NeMo-Gym and the call."""

from __future__ import annotations

import json
import secrets
import socket
import threading

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import relax_gym
from relax_gym.envs import check_env

from .training import train_three_steps, write_recipe

WEATHER = {"Paris": "rain", "Cairo": "sun", "Oslo": "snow", "Lima": "fog"}
TOOL = {"type": "function", "name": "get_weather", "description": "Today's weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
GOLD = ['<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>', "{expected_weather}"]


def resources_server(fail_verify: bool = False) -> Starlette:
    sessions: dict[str, dict] = {}

    def session(request: Request) -> dict:
        return sessions[request.cookies["session"]]

    async def seed_session(request: Request) -> JSONResponse:
        sid = secrets.token_hex(8)
        sessions[sid] = {"looked_up": []}
        reply = JSONResponse({})
        reply.set_cookie("session", sid)
        return reply

    async def get_weather(request: Request) -> JSONResponse:
        city = (await request.json())["city"]
        session(request)["looked_up"].append(city)
        return JSONResponse({"city": city, "weather": WEATHER.get(city, "unknown")})

    async def verify(request: Request) -> JSONResponse:
        if fail_verify:
            return JSONResponse({"detail": "the judge is down"}, status_code=500)
        body = await request.json()
        said = [c["text"] for item in body["response"]["output"] if item["type"] == "message" for c in item["content"]]
        called = [item["name"] for item in body["response"]["output"] if item["type"] == "function_call"]
        right = bool(said) and said[-1].strip().lower() == body["expected_weather"]
        looked_up = body["city"] in session(request)["looked_up"] and called == ["get_weather"]
        return JSONResponse({**body, "reward": 1.0 if right and looked_up else 0.0, "answered_right": float(right)})

    return Starlette(routes=[Route("/seed_session", seed_session, methods=["POST"]),
                             Route("/get_weather", get_weather, methods=["POST"]),
                             Route("/verify", verify, methods=["POST"])])


def serve(app: Starlette) -> tuple[uvicorn.Server, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn accepts them
    # log_config=None: uvicorn leaves logging alone (its dictConfig would close every handler of this process,
    # pytest's own among them)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def tasks(tmp_path):
    path = tmp_path / "weather.jsonl"
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"What is the weather in {city} today? "
                                                    "Look it up, then answer with the one word."}], "tools": [TOOL]},
             "city": city, "expected_weather": weather} for city, weather in WEATHER.items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def url():
    server, address = serve(resources_server())
    yield address
    server.should_exit = True


def test_a_resources_server_passes_check_env_with_its_session_and_verifier(url, tasks):
    env = relax_gym.make(f"nemo-gym:{url}", data_file=str(tasks), gold=GOLD)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed
    obs, info = env.reset(seed=1)
    assert obs[0].role == "system" and '"name": "get_weather"' in obs[0].text and "<tool_call>" in obs[0].text
    city = obs[1].text.split(" in ")[1].split(" today")[0]
    obs, reward, terminated, _, info = env.step(info["gold"])
    assert (reward, terminated) == (0.0, False) and obs[0].role == "tool"
    assert json.loads(obs[0].text) == {"city": city, "weather": WEATHER[city]}
    _, reward, terminated, _, info = env.step(WEATHER[city])
    assert (reward, terminated) == (1.0, True) and info["reward_breakdown"] == {"verify": 1.0, "answered_right": 1.0}
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(WEATHER[city])  # the right word without looking it up
    assert (reward, terminated) == (0.0, True) and info["reward_breakdown"]["answered_right"] == 1.0
    env.close()


def test_three_colocate_steps_on_a_resources_server(url, tasks, tmp_path):
    env = {"id": f"nemo-gym:{url}", "kwargs": {"data_file": str(tasks), "gold": GOLD}}
    train_three_steps(tmp_path, write_recipe(tmp_path, env))


def test_a_failing_verify_route_ends_the_episode_as_an_env_error(tasks):
    server, address = serve(resources_server(fail_verify=True))
    try:
        env = relax_gym.make(f"nemo-gym:{address}", data_file=str(tasks))
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step("rain")
        assert (info["status"], terminated, reward) == ("env_error", True, 0.0)
        assert info["error"].startswith(f"ForeignEnvError: NeMo-Gym {address}: POST /verify raised HTTPStatusError"), info["error"]
        env.close()
    finally:
        server.should_exit = True
