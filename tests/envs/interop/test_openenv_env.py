"""An OpenEnv env as a relax-gym env: an env written as OpenEnv's docs write one (an ``Environment`` with typed
Action / Observation / State, served by ``create_fastapi_app`` under uvicorn, in the OpenEnv venv) made with
``relax_gym.make("openenv:URL", ...)``: the adapter speaks to it with OpenEnv's own client. It passes check_env
(the gold action from a template over the session's ``state``), trains three colocate steps, and a server whose
step fails ends the episode as an ``env_error`` naming OpenEnv and the call."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.envs.remote import RemoteEnv
from relax_gym.envs.remote.launcher import wait_ready

from .openenv_example import ENVIRONMENT, MODELS
from .training import train_three_steps, write_recipe

# OpenEnv's pattern: models, an Environment, create_fastapi_app; served on a socket bound before uvicorn starts
SERVER = MODELS + ENVIRONMENT + r'''
import json, socket, sys
import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app

app = create_fastapi_app(SecretWordEnvironment, SecretWordAction, SecretWordObservation, max_concurrent_envs=32)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump({"url": "http://127.0.0.1:%d" % sock.getsockname()[1]}, f)
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
uvicorn.run(app, fd=sock.fileno(), log_level="warning")
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The example env under OpenEnv's server, one for the module (every test opens sessions of its own)."""
    python = ensure_venv(FRAMEWORKS["openenv"])
    ready = tmp_path_factory.mktemp("openenv-server") / "ready.json"
    process = subprocess.Popen([str(python), "-c", SERVER, str(ready)], stdin=subprocess.DEVNULL)
    why = wait_ready(process, ready, 300)
    assert why is None, f"the OpenEnv server {why}"
    yield json.loads(ready.read_text())["url"]
    process.terminate()
    process.wait(timeout=60)


def test_an_openenv_env_passes_check_env_through_openenvs_client(server, servers):
    assert importlib.util.find_spec("openenv") is None, "the trainer's venv must not have openenv"
    env = relax_gym.make(f"openenv:{server}", observation_field="prompt", gold="{secret}")
    assert isinstance(env.unwrapped, RemoteEnv)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed
    obs, info = env.reset(seed=4)
    assert obs[0].text == f"Say the word {info['gold']} back, and nothing else."
    _, reward, terminated, _, info = env.step(info["gold"].upper())
    assert (reward, terminated) == (1.0, True) and info["openenv_observation"]["prompt"] == "Right."
    env.close()


def test_three_colocate_steps_on_an_openenv_env(server, servers, tmp_path):
    recipe = write_recipe(tmp_path, {"id": f"openenv:{server}", "kwargs": {"observation_field": "prompt", "gold": "{secret}"}})
    train_three_steps(tmp_path, recipe)


def test_an_openenv_server_that_fails_a_step_ends_the_episode_as_an_env_error(server, servers):
    env = relax_gym.make(f"openenv:{server}", observation_field="prompt")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("break the board")
    assert (info["status"], terminated, reward) == ("env_error", True, 0.0)
    assert f"OpenEnv {server}: step raised RuntimeError: Server error" in info["error"], info["error"]
    env.close()
