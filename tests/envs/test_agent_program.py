"""Agent-program envs (relax_gym/envs/agent_program.py): a black-box program on the official openai client, run
as a local child process here (the sandboxed runner: tests/envs/test_agent_program_sandbox.py)."""

from __future__ import annotations

import json

import pytest

from relax_gym.envs import check_env
from relax_gym.envs.agent_program import (
    PYTHON,
    TELEMETRY_OFF,
    AgentEndpoint,
    AgentProgramEnv,
    ProgramRun,
    ProgramTask,
)
from relax_gym.envs.openai_agent import OpenAIAgentEnv
from tests.envs.scripted_model import ScriptedModel, gold_replies


@pytest.fixture
def env():
    e = OpenAIAgentEnv(runner="local")
    yield e
    e.close()


def test_gold_replies_through_the_real_agent_earn_the_full_reward(env):
    gold = gold_replies(OpenAIAgentEnv, seed=5)
    model = ScriptedModel(lambda body, i: gold[min(i, len(gold) - 1)])
    try:
        outcome = env.run_program(seed=5, endpoint=AgentEndpoint(model.base_url, "episode-key"))
    finally:
        model.close()
    assert outcome.status == "ok" and outcome.reward == pytest.approx(1.0), outcome
    assert outcome.reward_breakdown == {"accuracy": 1.0, "format": 1.0}
    assert len(model.requests) == 2 and model.keys == ["Bearer episode-key"] * 2
    first, second = model.requests
    assert first["tools"][0]["function"]["name"] == "python" and first["messages"][-1]["role"] == "user"
    # the agent ran the python tool itself and sent its output back as a tool message
    tool = second["messages"][-1]
    assert tool["role"] == "tool" and tool["content"].strip() == gold[1].split("<answer>")[1].split("</answer>")[0]


def test_a_wrong_final_answer_scores_format_only(env):
    model = ScriptedModel(lambda body, i: "<think>guess</think><answer>-1</answer>")
    try:
        outcome = env.run_program(seed=1, endpoint=AgentEndpoint(model.base_url, "k"))
    finally:
        model.close()
    assert outcome.status == "ok" and outcome.reward == pytest.approx(0.1)
    assert outcome.reward_breakdown == {"accuracy": 0.0, "format": 1.0}


class _Broken(AgentProgramEnv):
    def __init__(self, argv: list[str], **kwargs):
        super().__init__(runner="local", **kwargs)
        self.argv = argv

    def _make_task(self, options):
        return ProgramTask(prompt="p", argv=self.argv, files={"a.py": "import time, sys\ntime.sleep(float(sys.argv[1]))\n"})

    def _score(self, run: ProgramRun):
        return (0.5 if run.rc == 0 else 0.0), {"ran": float(run.rc == 0)}


class _Telling(_Broken):
    """A program that writes what its environment says of telemetry."""

    def _make_task(self, options):
        code = "import json, os\nopen('env.json', 'w').write(json.dumps(dict(os.environ)))\n"
        return ProgramTask(prompt="p", argv=[PYTHON, "tell.py"], files={"tell.py": code}, outputs=("env.json",))

    def _score(self, run: ProgramRun):
        self.seen = json.loads(run.outputs["env.json"])
        return 0.0, {}


def test_agent_sdks_telemetry_is_off_in_every_program():
    env = _Telling([])
    assert env.run_program(seed=0, endpoint=AgentEndpoint("http://127.0.0.1:9/v1", "k")).status == "ok"
    assert {k: env.seen.get(k) for k in TELEMETRY_OFF} == TELEMETRY_OFF
    assert env.seen["OPENAI_AGENTS_DISABLE_TRACING"] == "1" and env.seen["OPENAI_API_KEY"] == "k"


class OnCompletions(AgentProgramEnv):
    """An agent on an API the turn-by-turn endpoint does not serve (OpenAI's legacy text completions): it fails on
    its first call and says so on stderr."""

    def __init__(self, **kwargs):
        super().__init__(runner="local", **kwargs)

    def _make_task(self, options):
        code = ("import sys\nfrom openai import OpenAI\ntry:\n    OpenAI(max_retries=0).completions.create("
                "model='m', prompt='hi')\nexcept Exception as exc:\n    sys.exit(f'the model call failed: {type(exc).__name__}')\n")
        return ProgramTask(prompt="say hi", argv=[PYTHON, "agent.py"], files={"agent.py": code}, gold_replies=["hi"])

    def _score(self, run: ProgramRun):
        return (1.0 if run.rc == 0 else 0.0), {"ran": float(run.rc == 0)}


def test_a_turn_by_turn_agent_that_made_no_call_says_what_it_tripped_on():
    env = OnCompletions()
    try:
        obs, _ = env.reset(seed=0)
        assert obs[0].text == "say hi"  # it ended before its first call: the task is the opening
        _, reward, terminated, _, info = env.step("hi")
        assert terminated and reward == 0.0 and info["agent_rc"] == 1
        assert info["agent_first_http_error"].startswith("404 for POST /v1/completions: no route /v1/completions "
                                                         "(this endpoint serves POST /v1/chat/completions, "
                                                         "/v1/responses and /v1/messages)")
        report = env.program_report()
        assert report.startswith("the agent program exited with status 1 after 0 model call(s); its first refused "
                                 "request: 404 for POST /v1/completions")
        assert report.endswith("its stderr ends:\n  the model call failed: NotFoundError")
    finally:
        env.close()


class OnResponses(OnCompletions):
    """An agent on the Responses API (as the Agents SDK's default model calls it): instructions, one input, the
    answer printed to a file the scorer reads."""

    def _make_task(self, options):
        code = ("from openai import OpenAI\nr = OpenAI(max_retries=0).responses.create(model='m', instructions='Be brief.', "
                "input='Say hi.')\nopen('out.txt', 'w').write(r.output_text)\n")
        return ProgramTask(prompt="say hi", argv=[PYTHON, "agent.py"], files={"agent.py": code}, gold_replies=["hi"],
                           outputs=("out.txt",))

    def _score(self, run: ProgramRun):
        return float(run.outputs.get("out.txt") == "hi"), {}


def test_a_responses_api_agent_plays_turn_by_turn():
    env = OnResponses()
    try:
        obs, info = env.reset(seed=0)
        assert [(m.role, m.text) for m in obs] == [("system", "Be brief."), ("user", "Say hi.")]
        _, reward, terminated, _, info = env.step(info["gold"])
        assert terminated and reward == 1.0 and info["agent_rc"] == 0
    finally:
        env.close()


def test_a_program_that_cannot_start_is_an_env_error():
    outcome = _Broken(["/nonexistent/agent-binary"]).run_program(seed=0, endpoint=AgentEndpoint("http://127.0.0.1:9/v1", "k"))
    assert outcome.status == "env_error" and "nonexistent" in outcome.error and outcome.reward == 0.0


def test_a_program_that_runs_out_of_time_is_truncated_and_scored():
    env = _Broken([PYTHON, "a.py", "30"], program_timeout_s=1.0)
    outcome = env.run_program(seed=0, endpoint=AgentEndpoint("http://127.0.0.1:9/v1", "k"))
    assert outcome.status == "truncated" and outcome.info["agent_timed_out"] and outcome.reward == 0.0


def test_turn_by_turn_play_passes_check_env(env):
    report = check_env(env, seeds=(0,), skip_gym=True)
    assert "gold action => max reward" in report.passed


def test_turn_by_turn_observations_are_the_agents_calls(env):
    obs, info = env.reset(seed=2)
    system, user = obs
    assert system.role == "system" and "<tools>" in system.content[0].text and '"python"' in system.content[0].text
    assert user.role == "user" and user.content[0].text == env.task.prompt
    obs, reward, terminated, _, info = env.step(info["gold"])
    assert not terminated and [m.role for m in obs] == ["tool"] and "<tool_response>" in obs[0].content[0].text
    obs, reward, terminated, _, info = env.step(info["gold"])
    assert terminated and reward == pytest.approx(1.0) and obs == []
