"""Our envs served to OpenEnv clients (``relax-gym envs serve ID --protocol openenv``): OpenEnv's own server
(``openenv-core``, in the venv relax-gym made for it) around our env, and OpenEnv's official client
(``GenericEnvClient(...).sync()``, in that venv, over its WebSocket) plays whole episodes of ``nextqa-video`` and
``echo-ink-agent`` with the gold actions. Asserted on what the client received: the media decode there (the clip's
frames, the picture's pixels, the sound's samples), the rewards add up to the env's maximum, and the
``/schema`` route describes our action and observation."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.serve import start_openenv_server
from relax_gym.envs.interop.venvs import ensure_venv

from .media_probe import DECODE, EPISODES, assert_media

# runs in the OpenEnv venv: the official client plays one episode with the gold actions and reports what came
CLIENT = DECODE + r'''
import json, sys
from openenv.core.generic_client import GenericEnvClient

received, rewards = [], []
with GenericEnvClient(base_url=sys.argv[1]).sync() as env:
    result = env.reset(seed=int(sys.argv[2]))
    while True:
        received += media(result.observation["messages"])
        if result.done:
            break
        result = env.step({"text": result.observation["info"]["gold"]})
        rewards.append(result.reward)
    print(json.dumps({"media": received, "rewards": rewards, "status": result.observation["info"]["status"]}))
'''


@pytest.fixture(scope="module")
def openenv_python():
    return ensure_venv(FRAMEWORKS["openenv"])


@pytest.mark.parametrize("env_id, kinds", EPISODES)
def test_openenvs_own_client_plays_our_env_with_its_media(openenv_python, env_id, kinds):
    process, url = start_openenv_server(env_id)
    try:
        played = subprocess.run([str(openenv_python), "-c", CLIENT, url, "3"], capture_output=True, text=True, timeout=300)
        assert played.returncode == 0, played.stderr[-3000:]
        got = json.loads(played.stdout.strip().splitlines()[-1])
        schema = httpx.get(f"{url}/schema", timeout=30).json()
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert got["status"] == "ok" and sum(got["rewards"]) == pytest.approx(1.0), got  # the gold episode's maximum
    assert_media(got["media"], kinds)
    assert "text" in json.dumps(schema["action"]) and "messages" in json.dumps(schema["observation"])


def test_openenv_serving_refuses_a_non_loopback_address_and_an_unknown_env():
    runner = CliRunner()
    wide = runner.invoke(app, ["envs", "serve", "nextqa-video", "--protocol", "openenv", "--host", "0.0.0.0"])
    assert wide.exit_code == 2 and "loopback only" in wide.output
    unknown = runner.invoke(app, ["envs", "serve", "no-such-env", "--protocol", "openenv"])
    assert unknown.exit_code == 1 and "no-such-env" in unknown.output
