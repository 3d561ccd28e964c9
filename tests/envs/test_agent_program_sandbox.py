"""The openai-agent env's program inside a real sandbox (docker and bwrap): no network interface but lo, the model
reached only through the bind-mounted socket, the openai package from the mounted runtime copy."""

from __future__ import annotations

import pytest

from relax_gym.envs.agent_run import AgentEndpoint
from relax_gym.envs.episode_sandbox import shared_pool
from relax_gym.envs.openai_agent import OpenAIAgentEnv
from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import get_backend
from tests.envs.scripted_model import ScriptedModel, gold_replies

pytestmark = pytest.mark.integration


@pytest.fixture(params=["docker", "bwrap"])
def backend(request):
    b = get_backend(request.param)
    problem = b.check()
    if problem:
        pytest.skip(f"{request.param} sandbox backend unavailable: {problem}")
    yield request.param
    # the episodes' sandboxes come from the process-wide pool: closing it must leave nothing of ours alive
    sync.run(shared_pool(request.param).close())
    assert not b.live()


def test_the_sandboxed_agent_solves_the_task_through_the_socket_only(backend):
    gold = gold_replies(OpenAIAgentEnv, seed=7)
    model = ScriptedModel(lambda body, i: gold[min(i, len(gold) - 1)])
    env = OpenAIAgentEnv(backend=backend)
    try:
        outcome = env.run_program(seed=7, endpoint=AgentEndpoint(model.base_url, "sandbox-key"))
    finally:
        env.close()
        model.close()
    assert outcome.status == "ok" and outcome.reward == pytest.approx(1.0), outcome
    assert outcome.info["sandbox_interfaces"] == ["lo"]
    assert len(model.requests) == 2 and model.keys == ["Bearer sandbox-key"] * 2


def test_a_sandboxed_agent_cannot_reach_a_missing_endpoint(backend):
    """With nothing listening behind the socket the agent's call fails; the episode scores 0 and is not an env error."""
    env = OpenAIAgentEnv(backend=backend, program_timeout_s=60)
    try:
        outcome = env.run_program(seed=1, endpoint=AgentEndpoint("http://127.0.0.1:9/v1", "k"))
    finally:
        env.close()
    assert outcome.status == "ok" and outcome.reward == 0.0 and outcome.info["agent_rc"] != 0
