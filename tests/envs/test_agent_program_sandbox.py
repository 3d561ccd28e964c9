"""The openai-agent env's program inside a real sandbox (docker and bwrap): no network interface but lo, the model
reached only through the bind-mounted socket, the openai package from the mounted runtime copy."""

from __future__ import annotations

import pytest

from relax_gym.envs.agent_run import AgentEndpoint
from relax_gym.envs.episode_sandbox import shared_pool
from relax_gym.envs.openai_agent import OpenAIAgentEnv
from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import get_backend
from tests.envs.agent_clients import INSTRUCTIONS, NOTEBOOK, NotebookAgentEnv
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


# An agent on the OpenAI Agents SDK (its default Responses model, a function tool): its packages come from a venv of
# their own (its openai pin is not ours), copied into the sandbox; it reaches the endpoint through the socket like
# any agent. The same program and the other clients train in tests/integration/test_openai_agent_training.py.
def test_an_agents_sdk_program_from_its_own_venv_plays_turn_by_turn_in_the_sandbox(backend):
    env = NotebookAgentEnv("agents-sdk", backend=backend)
    try:
        obs, info = env.reset(seed=3)
        assert [m.role for m in obs] == ["system", "user"] and obs[0].text.startswith(INSTRUCTIONS)
        assert '"name": "lookup"' in obs[0].text  # the SDK's tool schema, rendered as the trainer's endpoint renders it
        name = obs[1].text.removeprefix("What number is next to ").removesuffix("?")
        obs, reward, terminated, _, info = env.step(info["gold"])  # the tool call: the SDK runs it and calls again
        assert not terminated and [(m.role, m.text) for m in obs] == [("tool", f"<tool_response>\n{NOTEBOOK[name]}\n</tool_response>")]
        _, reward, terminated, _, info = env.step(info["gold"])
    finally:
        env.close()
    assert terminated and reward == 1.0 and info["agent_rc"] == 0 and info["sandbox_interfaces"] == ["lo"]
