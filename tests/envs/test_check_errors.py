"""What an env author sees when ``check_env`` fails: one ``EnvCheckError`` naming the rule and the culprit (message,
part, tool traceback), whatever the env raised, gymnasium's own asserts included."""

from __future__ import annotations

import numpy as np
import pytest

from relax_gym.envs import EnvCheckError, check_env
from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.spaces import Conversation
from relax_gym.envs.tool_env import Task, ToolEnv
from relax_gym.envs.tools import tool
from relax_gym.omni import Message
from relax_gym.omni.parts import AudioPart, ImagePart, TextPart


class OneQuestion(AgentEnv):
    """A one-turn env whose opening the tests below break in different ways."""

    media_kinds = ("image",)
    opening_parts: tuple = ()

    def _reset(self, options):
        return Opening([Message("user", (TextPart("Which colour? Answer in <answer></answer>."), *self.opening_parts))],
                       gold="<answer>A</answer>")

    def _step(self, action):
        ok = float(action == "<answer>A</answer>")
        return Outcome([], ok, True, {"accuracy": ok})


class SpeaksButDeclaresNoAudio(OneQuestion):
    opening_parts = (AudioPart.of(np.zeros(1600, dtype=np.float32), rate_of_array=16_000),)


class RawArrayInThePrompt(OneQuestion):
    def _reset(self, options):
        return Opening([Message("user", (TextPart("Look:"), np.zeros((8, 8, 3), dtype=np.uint8)))], gold="<answer>A</answer>")


class SpaceThatRefusesEverything(Conversation):
    """A custom space without ``problem``: gymnasium's checker then asserts on its own."""

    def contains(self, x):
        return False

    problem = None


class CustomSpace(OneQuestion):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.observation_space = SpaceThatRefusesEverything(self.media_kinds)


def test_a_media_kind_left_out_of_media_kinds_names_the_part():
    with pytest.raises(EnvCheckError) as caught:
        check_env(SpeaksButDeclaresNoAudio())
    message = str(caught.value)
    assert caught.value.rule == "gymnasium env_checker" and message.startswith("[gymnasium env_checker]")
    assert "message 0 (user), part 1: an audio part" in message and "add 'audio' to the env's media_kinds" in message
    assert "\n" not in message  # one line, no traceback


def test_a_raw_array_in_a_prompt_names_the_message_and_part():
    with pytest.raises(EnvCheckError) as caught:
        check_env(RawArrayInThePrompt())
    message = str(caught.value)
    assert "user message, content[1]: a numpy.ndarray is not a part" in message and "ImagePart.of" in message
    assert isinstance(caught.value.__cause__, TypeError)


class OldGymStep(OneQuestion):
    """Ported from the old gym API: step returns four values (gymnasium's checker fails unpacking them)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


def test_an_exception_inside_gymnasiums_checker_becomes_one_env_check_error():
    with pytest.raises(EnvCheckError, match=r"^\[gymnasium env_checker\] ValueError: not enough values to unpack "
                                            r"\(expected 5, got 4\)$") as caught:
        check_env(OldGymStep())
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_custom_space_that_refuses_the_observation_is_named_at_reset():
    with pytest.raises(EnvCheckError, match=r"^\[gymnasium env_checker\] ValueError: CustomSpace.reset: the observation "
                                            r"is not within Conversation"):
        check_env(CustomSpace())


def test_an_image_part_of_a_declared_kind_passes():
    class ShowsAnImage(OneQuestion):
        opening_parts = (ImagePart.of(np.zeros((8, 8, 3), dtype=np.uint8)),)

    assert "gymnasium env_checker" in check_env(ShowsAnImage()).passed


def test_a_step_that_gives_an_undeclared_part_is_an_env_error_naming_it():
    class ReplyWithAudio(OneQuestion):
        def _step(self, action):
            return Outcome([Message("user", (AudioPart.of(np.zeros(160, dtype=np.float32), rate_of_array=16_000),))],
                           0.0, False, {})

    env = ReplyWithAudio(max_turns=2)
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("anything")
    assert (obs, terminated, info["status"]) == ([], True, "env_error")
    assert "part 0: an audio part" in info["error"]


@tool
def divide(a: int, b: int) -> str:
    """Divide two numbers.

    Args:
        a: the dividend
        b: the divisor
    """
    return str(a / b)


class BrokenCalculator(ToolEnv):
    """The gold plan calls a tool that raises (an env bug: b is 0)."""

    media_kinds = ()

    def __init__(self, **kwargs):
        super().__init__([divide], max_turns=3, **kwargs)

    def _make_task(self, options):
        call = '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'
        return Task(prompt=[TextPart("What is 1/0?")], gold_calls=[call], gold_answer="<answer>inf</answer>")

    def _accuracy(self, answer):
        return float(answer == "inf")


def test_a_tool_that_raises_shows_its_traceback_in_check_and_is_counted():
    env = BrokenCalculator()
    _, info = env.reset(seed=0)
    _, _, _, _, info = env.step(info["gold"])
    assert (info["tool_errors"], info["tool_crashes"]) == (1, 1)
    assert "ZeroDivisionError" in info["tool_traceback"] and "in divide" in info["tool_traceback"]
    with pytest.raises(EnvCheckError) as caught:
        check_env(BrokenCalculator())
    message = str(caught.value)
    assert caught.value.rule == "gold action => max reward"
    assert "gold action ended with status truncated" in message and "ZeroDivisionError: division by zero" in message
    assert 'in divide' in message  # the tool's own frame, from the traceback


def test_a_missing_sandbox_backend_is_named_as_such(monkeypatch):
    import relax_gym
    from relax_gym.sandbox import backends
    from relax_gym.sandbox.base import SandboxUnavailable

    def none_works(name=None):
        raise SandboxUnavailable("no sandbox backend works on this machine (docker: no engine; bwrap: not installed)")

    from relax_gym.envs import episode_sandbox
    from relax_gym.sandbox import pool

    for module in (backends, episode_sandbox, pool):  # each bound the name at import
        monkeypatch.setattr(module, "select_backend", none_works)
    env = relax_gym.make("tool-use")
    try:
        with pytest.raises(EnvCheckError, match=r"ended in an env error: SandboxUnavailable: no sandbox backend works"):
            check_env(env)
    finally:
        env.close()
