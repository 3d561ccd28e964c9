"""tool-use: the python tool runs the agent's code in a real sandbox (each backend), leased per episode."""

from __future__ import annotations

import socket

import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.tool_use import generate_task
from relax_gym.envs.episode_sandbox import shared_pool

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def fresh_shared_pool(backend):
    """Each test starts and ends with no pool: closing it must leave nothing of ours alive."""
    yield
    from relax_gym.sandbox import sync

    sync.run(shared_pool(backend.name).close())
    assert not backend.live()


def call(code: str) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_generated_solutions_match_answers():
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(12):
        question, code, answer = generate_task(rng)
        scope: dict = {}
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(code, scope)
        assert int(buf.getvalue()) == answer, question


def test_gold_policy_reaches_max_reward(backend):
    env = relax_gym.make("tool-use", backend=backend.name)
    try:
        obs, info = env.reset(seed=0)
        assert "python" in obs[0].text and "<tools>" in obs[0].text
        obs, reward, terminated, _, info = env.step(info["gold"])
        assert not terminated and info["tool_errors"] == 0
        answer = str(env.unwrapped.answer)
        assert obs[0].role == "tool" and answer in obs[0].text
        _, reward, terminated, _, info = env.step(info["gold"])
        assert reward == 1.0 and terminated
    finally:
        env.close()
    assert not shared_pool(backend.name)._leases  # handed back at episode end


def test_hostile_and_broken_code_are_tool_errors_not_crashes(backend):
    host = socket.socket()  # a listener on the host's loopback: the agent's code must not reach it
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    host.settimeout(0.5)
    env = relax_gym.make("tool-use", backend=backend.name, code_timeout_s=2.0)
    try:
        env.reset(seed=1)
        obs, reward, terminated, *_ = env.step(call("while True: pass"))
        assert not terminated and "[killed: ran longer than 2 s]" in obs[0].text
        obs, *_ = env.step(call("raise ValueError('nope')"))
        assert "ValueError: nope" in obs[0].text and "[exit code 1]" in obs[0].text
        port = host.getsockname()[1]
        obs, *_ = env.step(call(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"))
        assert "ConnectionRefusedError" in obs[0].text or "OSError" in obs[0].text, obs[0].text
        with pytest.raises(TimeoutError):
            host.accept()  # nothing came in
    finally:
        env.close()
        host.close()
    assert not shared_pool(backend.name)._leases


def test_episodes_do_not_share_files(backend):
    env = relax_gym.make("tool-use", backend=backend.name)
    try:
        env.reset(seed=2)
        env.step(call("open('/tmp/note', 'w').write('secret'); open('left', 'w').write('x')"))
        env.reset(seed=3)  # ends the first episode: its sandbox is reset or destroyed
        obs, *_ = env.step(call("import os; print(os.path.exists('/tmp/note'), os.path.exists('left'))"))
        assert "False False" in obs[0].text
    finally:
        env.close()


def test_check_env_and_pool_is_clean(backend):
    env = relax_gym.make("tool-use", backend=backend.name)
    try:
        assert "garbage action => min reward, no exception" in check_env(env).passed
    finally:
        env.close()
    pool = shared_pool(backend.name)
    assert not pool._leases


def test_play_gold_on_tool_use_from_the_cli(backend, monkeypatch):
    from typer.testing import CliRunner

    from relax_gym.cli import app

    monkeypatch.setenv("RELAX_GYM_SANDBOX", backend.name)
    result = CliRunner().invoke(app, ["envs", "play", "tool-use", "--episodes", "2"])
    assert result.exit_code == 0, result.output
    assert "<tool_response>" in result.output and "mean return over 2 episode(s): 1.000" in result.output


def test_close_returns_after_the_sandbox_is_gone(backend):
    """close() on the last env of the process closes the shared pool: its sandbox (a container, or a bwrap tree) is
    gone when close() returns. While another env holds the pool, a closed env's sandbox stays warm for it."""
    first = relax_gym.make("tool-use", backend=backend.name)
    second = relax_gym.make("tool-use", backend=backend.name)
    try:
        _, info = first.reset(seed=0)
        first.step(info["gold"])  # the first tool call leases a sandbox
        assert len(backend.live()) == 1
        first.close()
        assert len(backend.live()) == 1, "the second env still holds the pool: the sandbox stays warm"
        _, info = second.reset(seed=1)
        obs, *_ = second.step(info["gold"])
        assert obs[0].role == "tool" and shared_pool(backend.name).stats.reused >= 1
    finally:
        first.close()
        second.close()
    assert backend.live() == [], "close() returned with a sandbox of ours still there"
