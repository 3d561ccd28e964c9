"""A verifiers environment (``pip install verifiers``, in the venv relax-gym made for it), written as verifiers'
docs write one (a module with ``load_environment`` returning a ``vf.SingleTurnEnv`` over a ``datasets.Dataset``
and a ``vf.Rubric`` of reward functions): loaded by ``vf.load_environment``, it passes check_env with verifiers'
own rollout and rubric scoring each episode (each reward function a component of the breakdown), plays a
multi-turn ``vf.MultiTurnEnv`` whose ``env_response`` and stop condition see every turn, trains three
colocate steps, and a rollout whose env_response raises ends its episode as an ``env_error`` naming verifiers and the call."""

from __future__ import annotations

import importlib.util

import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.envs.remote import RemoteEnv

from .training import train_three_steps, write_recipe

SUMS = [(3, 4), (12, 30), (7, 7), (21, 5), (40, 2), (9, 16), (11, 11), (6, 60)]

ENV_MODULE = '''
import verifiers as vf
from datasets import Dataset


def load_environment(fail: bool = False, turns: int = 1, tools: bool = False, **kwargs):
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in SUMS]
    parser = vf.Parser()
    if tools:  # a ToolEnv as verifiers' docs write one: a Python function is the tool
        def add(a: int, b: int) -> int:
            """Add two whole numbers.

            Args:
                a: the first number
                b: the second number
            """
            return a + b

        def used_the_tool(completion, answer, **kwargs) -> float:
            said = [m.get("content") for m in completion if m.get("role") == "tool"]
            final = completion[-1].get("content") if completion[-1].get("role") == "assistant" else ""
            return 1.0 if answer in said and (final or "").strip() == answer else 0.0

        rows = [{**row, "info": {"a": a, "b": b}} for row, (a, b) in zip(rows, SUMS)]
        return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[add], max_turns=4,
                          rubric=vf.Rubric(funcs=[used_the_tool]))

    def exact_answer(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    def a_number(completion, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip().isdigit() else 0.0

    rubric = vf.Rubric(funcs=[exact_answer, a_number], weights=[0.8, 0.2], parser=parser)
    if turns > 1:  # a wrong number is told to try again, until the answer or the last turn
        return TryAgain(dataset=Dataset.from_list(rows), max_turns=turns, parser=parser, rubric=rubric)
    if fail:  # a two-turn env whose response to the first answer raises
        return Broken(dataset=Dataset.from_list(rows), max_turns=2, parser=parser, rubric=rubric)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Answer with the number only.",
                            parser=parser, rubric=rubric)


class TryAgain(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": f"No. Try again ({len(state['trajectory'])} so far)."}]

    @vf.stop
    async def answered(self, state, **kwargs) -> bool:
        steps = state["trajectory"]
        return bool(steps) and (self.parser.parse_answer(steps[-1]["completion"]) or "").strip() == state["answer"]


class Broken(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise RuntimeError("the board broke")
'''.replace("SUMS", repr(SUMS))


@pytest.fixture(scope="module")
def env_module(tmp_path_factory):
    """The env's module on the path of the verifiers venv's server (through PYTHONPATH, which it inherits)."""
    ensure_venv(FRAMEWORKS["verifiers"])
    folder = tmp_path_factory.mktemp("vf-env")
    (folder / "vf_sums.py").write_text(ENV_MODULE)
    return folder


@pytest.fixture
def on_path(env_module, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(env_module))


def test_a_verifiers_env_passes_check_env_scored_by_its_rubric(on_path, servers):
    assert importlib.util.find_spec("verifiers") is None, "the trainer's venv must not have verifiers"
    env = relax_gym.make("verifiers:vf-sums")
    assert isinstance(env.unwrapped, RemoteEnv)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed

    obs, info = env.reset(seed=5)
    assert [m.role for m in obs] == ["system", "user"] and obs[0].text == "Answer with the number only."
    a, b = SUMS[info["task_index"]]
    assert obs[1].text == f"What is {a} + {b}?" and info["gold"] == str(a + b)
    _, reward, terminated, _, info = env.step(str(a + b + 1))
    assert terminated and reward == pytest.approx(0.2)  # a number, the wrong one: the rubric's weights
    assert info["reward_breakdown"]["exact_answer"] == 0.0 and info["reward_breakdown"]["a_number"] == 1.0
    env.reset(seed=5)
    _, reward, terminated, _, info = env.step(str(a + b))
    assert terminated and reward == pytest.approx(1.0) and info["reward_breakdown"]["exact_answer"] == 1.0
    env.close()


def test_a_multi_turn_verifiers_env_keeps_its_state_across_steps(on_path, servers):
    env = relax_gym.make("verifiers:vf-sums", env_args={"turns": 3})
    obs, info = env.reset(seed=2)
    answer = info["gold"]
    obs, reward, terminated, _, info = env.step("0")
    assert not terminated and reward == 0.0 and [m.text for m in obs] == ["No. Try again (1 so far)."]
    obs, reward, terminated, _, info = env.step("1")
    assert not terminated and [m.text for m in obs] == ["No. Try again (2 so far)."]
    _, reward, terminated, _, info = env.step(answer)
    assert terminated and reward == pytest.approx(1.0)  # the rubric scores the final answer
    env.reset(seed=2)
    _, reward, terminated, _, info = env.step(answer)  # the stop condition ends it at once
    assert terminated and reward == pytest.approx(1.0) and info["stop_condition"] == "answered"
    env.close()


def test_a_verifiers_tool_env_gets_the_policys_tool_calls_and_runs_its_tools(on_path, servers):
    """The ToolEnv's tools are written into the opening as our tool-call format; the policy's ``<tool_call>`` is
    verifiers' tool call, run by verifiers, whose result is the next observation; its rubric scores the end."""
    gold = ['<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>', "{answer}"]
    env = relax_gym.make("verifiers:vf-sums", env_args={"tools": True}, gold=gold)
    report = check_env(env)
    assert "gold action => max reward" in report.passed
    obs, info = env.reset(seed=3)
    a, b = SUMS[info["task_index"]]
    assert obs[0].role == "system" and '"name": "add"' in obs[0].text and "<tool_call>" in obs[0].text
    obs, reward, terminated, _, info = env.step(info["gold"])
    assert not terminated and reward == 0.0 and [(m.role, m.text) for m in obs] == [("tool", str(a + b))]
    assert info["gold"] == str(a + b)
    _, reward, terminated, _, info = env.step(str(a + b))
    assert terminated and reward == 1.0 and info["reward_breakdown"]["used_the_tool"] == 1.0
    env.reset(seed=3)
    _, reward, terminated, _, _ = env.step(str(a + b))  # the right sum without the tool
    assert terminated and reward == 0.0
    env.close()


def test_three_colocate_steps_on_a_verifiers_env(on_path, servers, tmp_path):
    train_three_steps(tmp_path, write_recipe(tmp_path, {"id": "verifiers:vf-sums"}))


def test_a_rollout_that_raises_ends_its_episode_as_an_env_error(on_path, servers):
    env = relax_gym.make("verifiers:vf-sums", env_args={"fail": True})
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("7")
    assert (info["status"], terminated, reward) == ("env_error", True, 0.0)
    assert info["error"].startswith("ForeignEnvError: verifiers vf-sums: rollout"), info["error"]
    assert "the board broke" in info["error"]
    env.close()
