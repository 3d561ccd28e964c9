"""The AgentEnv contract, on a small multi-turn env written here (not one of the built-ins)."""

from __future__ import annotations

import pytest

from relax_gym.envs import AgentEnv, Opening, Outcome, Status
from relax_gym.omni import Message, TextPart


class Countdown(AgentEnv):
    """The user says a number n; the agent must answer n-1, n-2, ... down to 0, one number per turn."""

    media_kinds = ()

    def __init__(self, max_turns: int = 10, fail_on: str | None = None, **kw) -> None:
        super().__init__(max_turns=max_turns, **kw)
        self.fail_on = fail_on

    def _reset(self, options):
        self.n = int(options.get("start", self.np_random.integers(2, 5)))
        return Opening([Message("user", (TextPart(f"count down from {self.n}"),))], gold=str(self.n - 1))

    def _step(self, action):
        if action == self.fail_on:
            raise RuntimeError("backend exploded")
        ok = action.strip() == str(self.n - 1)
        self.n -= 1
        done = not ok or self.n == 0
        msgs = [] if done else [Message("user", (TextPart("next"),))]
        return Outcome(msgs, reward=1.0 if ok else 0.0, terminated=done, reward_breakdown={"correct": float(ok)}, gold=str(self.n - 1))


def test_observations_are_append_only_and_history_holds_everything():
    env = Countdown()
    obs, info = env.reset(options={"start": 3})
    assert [m.text for m in obs] == ["count down from 3"]
    seen = list(obs)
    for expected in ("2", "1", "0"):
        assert info["gold"] == expected
        obs, reward, terminated, truncated, info = env.step(info["gold"])
        seen += [Message("assistant", (TextPart(expected),))] + obs
        assert reward == 1.0
    assert terminated and not truncated and info["status"] == "ok"
    assert env.history == seen
    assert [m.role for m in env.history] == ["user", "assistant", "user", "assistant", "user", "assistant"]


def test_info_keys_and_turn_counter():
    env = Countdown()
    _, info = env.reset(seed=3)
    assert {"episode_id", "turn", "status", "gold"} <= info.keys() and info["turn"] == 0
    _, _, _, _, info = env.step(info["gold"])
    assert info["turn"] == 1 and info["reward_breakdown"] == {"correct": 1.0}


def test_same_seed_same_episode_and_episode_ids_differ_without_seed():
    env = Countdown()
    a = env.reset(seed=7)
    b = env.reset(seed=7)
    assert a[0] == b[0] and a[1] == b[1]
    c = env.reset()
    assert c[1]["episode_id"] != b[1]["episode_id"]


def test_truncation_at_max_turns():
    env = Countdown(max_turns=2)
    _, info = env.reset(options={"start": 4})
    env.step(info["gold"])
    _, _, terminated, truncated, info = env.step("2")
    assert truncated and not terminated and info["status"] == Status.TRUNCATED


@pytest.mark.parametrize(
    "action, detail",
    [("", "empty action"), ("   \n", "empty action"), ("9" * 1_000_001, "more than max_action_chars"), (42, "must be a str")],
)
def test_bad_actions_give_min_reward_and_a_status_not_an_exception(action, detail):
    env = Countdown()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert (obs, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["status"] == "invalid_action" and detail in info["status_detail"]


def test_env_exception_masks_the_episode():
    env = Countdown(fail_on="boom")
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("boom")
    assert terminated and reward == 0.0 and info["status"] == "env_error"
    assert "RuntimeError: backend exploded" in info["error"]


def test_step_after_the_end_asks_for_reset():
    env = Countdown()
    env.reset(seed=0)
    env.step("")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")


def test_render_ansi_and_invalid_render_mode():
    env = Countdown(render_mode="ansi")
    env.reset(options={"start": 2})
    env.step("1")
    assert env.render() == "user: count down from 2\nassistant: 1\nuser: next"
    with pytest.raises(ValueError, match="render_mode"):
        Countdown(render_mode="human")


def test_spaces():
    env = Countdown(max_action_chars=100)
    assert env.action_space.contains("x" * 100) and not env.action_space.contains("x" * 101)
    assert not env.action_space.contains(b"bytes")
    sample = env.action_space.sample()
    assert isinstance(sample, str) and 1 <= len(sample) <= 64
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    assert not env.observation_space.contains([{"role": "user"}])
