"""The openai-agent env's program inside a real sandbox (docker and bwrap): no network interface but lo, the model
reached only through the bind-mounted socket, the openai package from the mounted runtime copy."""

from __future__ import annotations

import pytest

from relax_gym.envs.agent_program import PYTHON, AgentProgramEnv, ProgramRun, ProgramTask
from relax_gym.envs.agent_run import AgentEndpoint
from relax_gym.envs.interop.venvs import client_venv
from relax_gym.envs.episode_sandbox import shared_pool
from relax_gym.envs.openai_agent import OpenAIAgentEnv
from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import get_backend
from tests.envs.scripted_model import ScriptedModel, gold_replies
from tests.trainer.gateway.test_messages_route import ANTHROPIC

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


# An agent on Anthropic's own client: its packages come from the client's venv (its pins are not ours), copied into
# the sandbox; it reaches the endpoint through the socket like any agent
ANTHROPIC_AGENT = """
import os
import anthropic
client = anthropic.Anthropic(base_url=os.environ["OPENAI_BASE_URL"].removesuffix("/v1"),
                             api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
reply = client.messages.create(model="policy", max_tokens=32, messages=[{"role": "user", "content": open("task.txt").read()}])
open("answer.txt", "w").write(reply.content[0].text)
"""


class AnthropicAgent(AgentProgramEnv):
    def __init__(self, **kwargs):
        venv = client_venv("anthropic", ANTHROPIC).parent.parent
        super().__init__(python_packages=("anthropic",), python_venv=str(venv), **kwargs)

    def _make_task(self, options):
        self.word = ["amber", "basil", "cedar"][int(self.np_random.integers(3))]
        return ProgramTask(prompt="say the word", argv=[PYTHON, "agent.py"], outputs=("answer.txt",),
                           files={"agent.py": ANTHROPIC_AGENT, "task.txt": f"Say {self.word}."}, gold_replies=[self.word])

    def _score(self, run: ProgramRun):
        return float(run.outputs.get("answer.txt", "").strip() == self.word), {}


def test_an_agent_on_anthropics_client_from_its_own_venv_plays_in_the_sandbox(backend):
    env = AnthropicAgent(backend=backend)
    try:
        obs, info = env.reset(seed=3)
        assert [(m.role, m.text) for m in obs] == [("user", f"Say {env.word}.")]  # its call, through /v1/messages
        _, reward, terminated, _, info = env.step(info["gold"])
    finally:
        env.close()
    assert terminated and reward == 1.0 and info["agent_rc"] == 0 and info["sandbox_interfaces"] == ["lo"]
