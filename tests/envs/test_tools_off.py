"""``tools_enabled=False``: the agent envs as their own no-tool baseline (benchmarks/agent_learning.py). No tool is
listed or announced, a tool call is answered with an error and nothing runs, the gold plan answers at once."""

from __future__ import annotations

import json

import pytest

import relax_gym
from relax_gym.envs import check_env

AGENT_IDS = ["nextqa-video-agent", "echo-ink-agent"]


def text_of(messages) -> str:
    return "".join(p.text for m in messages for p in m.content if p.kind == "text")


def call(name: str, **arguments) -> str:
    return f'<think>look</think><tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.mark.parametrize("env_id", AGENT_IDS)
def test_no_tool_is_listed_or_announced(env_id):
    on, _ = relax_gym.make(env_id).reset(seed=2)
    off, _ = relax_gym.make(env_id, tools_enabled=False).reset(seed=2)
    assert "<tools>" in text_of(on[:1]) and "<tools>" not in text_of(off[:1])
    assert "tool call" not in text_of(off[:1])
    assert "\nTools:" in text_of(on[1:]) and "Tools:" not in text_of(off[1:])
    # the same record and the same first look otherwise
    assert [p.kind for p in off[1].content] == [p.kind for p in on[1].content if not getattr(p, "text", "").startswith("\nTools:")]


def test_tool_call_is_refused_and_not_run():
    env = relax_gym.make("nextqa-video-agent", tools_enabled=False)
    env.reset(seed=3)
    base = env.unwrapped
    left = base.frames.left
    obs, reward, terminated, truncated, info = env.step(call("watch", start_s=0, end_s=2, fps=2))
    assert not (terminated or truncated) and reward == 0.0
    assert [m.role for m in obs] == ["tool"] and not [p for m in obs for p in m.media()]
    assert "Error: no tools" in text_of(obs)
    assert info["tool_calls"] == 1 and info["tool_errors"] == 1 and base.frames.left == left


@pytest.mark.parametrize("env_id", AGENT_IDS)
def test_gold_answers_at_once_and_check_env_passes(env_id):
    env = relax_gym.make(env_id, tools_enabled=False)
    _, info = env.reset(seed=5)
    assert "<tool_call>" not in info["gold"] and "<answer>" in info["gold"]
    _, reward, terminated, _, info = env.step(info["gold"])
    assert terminated and reward == pytest.approx(1.0) and info["tool_calls"] == 0
    assert "gold action => max reward" in check_env(relax_gym.make(env_id, tools_enabled=False)).passed


def test_instructions_still_override_the_head():
    obs, _ = relax_gym.make("nextqa-video-agent", tools_enabled=False, instructions="Answer now.").reset(seed=1)
    assert text_of(obs[:1]) == "Answer now."
