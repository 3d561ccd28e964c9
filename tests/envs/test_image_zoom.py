"""image-zoom: an omni tool env whose tool returns a new image part; the multi-turn ToolEnv machinery."""

from __future__ import annotations

import json

import numpy as np

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.image_zoom import COLOURS
from relax_gym.omni import ImagePart, dumps, loads


def test_gold_policy_zooms_then_answers():
    env = relax_gym.make("image-zoom")
    obs, info = env.reset(seed=3)
    overview = obs[1].content[0].decode()
    assert overview.shape == (48, 48, 3)
    obs, reward, terminated, _, info = env.step(info["gold"])
    assert (reward, terminated) == (0.0, False) and info["tool_calls"] == 1 and info["tool_errors"] == 0
    (tool_msg,) = obs
    zoomed = [p for p in tool_msg.content if isinstance(p, ImagePart)][0].decode()
    colour = env.unwrapped.task.info["colour"]
    assert (zoomed.reshape(-1, 3) == COLOURS[colour]).all(axis=1).sum() >= 36  # the square, at full detail
    _, reward, terminated, _, info = env.step(info["gold"])
    assert reward == 1.0 and terminated and info["reward_breakdown"] == {"accuracy": 1.0, "format": 1.0}


def test_overview_does_not_show_the_colour_exactly():
    env = relax_gym.make("image-zoom")
    obs, info = env.reset(seed=5)
    overview = obs[1].content[0].decode().reshape(-1, 3).astype(int)
    colour = np.array(COLOURS[env.unwrapped.task.info["colour"]])
    assert np.abs(overview - colour).sum(axis=1).min() > 30


def test_garbage_tool_call_gets_an_error_and_the_episode_continues():
    env = relax_gym.make("image-zoom")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "zoom", "arguments": {"x": 999, "y": 0, "w": 8, "h": 8}}</tool_call>')
    assert not terminated and not truncated and reward == 0.0 and info["tool_errors"] == 1
    assert "Error: (x, y) = (999, 0) lies outside" in obs[0].text
    obs, *_ = env.step("<tool_call>{not json}</tool_call>")
    assert "not valid JSON" in obs[0].text
    obs, *_ = env.step("I am thinking")
    assert obs[0].role == "user" and "final answer" in obs[0].text


def test_running_out_of_turns_truncates_with_zero_reward():
    env = relax_gym.make("image-zoom", max_turns=2)
    env.reset(seed=0)
    env.step("hmm")
    _, reward, terminated, truncated, info = env.step("hmm")
    assert truncated and not terminated and reward == 0.0 and info["status"] == "truncated"


def test_observations_round_trip_through_json():
    env = relax_gym.make("image-zoom")
    obs, info = env.reset(seed=1)
    obs2, *_ = env.step(info["gold"])
    for messages in (obs, obs2):
        text = dumps(messages)
        assert loads(text) == messages
        assert json.loads(text)[0]["content"]
    assert np.array_equal(loads(dumps(obs2))[0].content[1].decode(), obs2[0].content[1].decode())


def test_check_env_passes():
    assert "gold action => max reward" in check_env(relax_gym.make("image-zoom")).passed
