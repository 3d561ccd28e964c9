"""The episode runner against a scripted engine twin (the real engine over HTTP is tested in the smoke runs)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

import relax_gym
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.rollout.episode import run_episode


@dataclass
class Out:
    output_ids: list[int]
    output_logprobs: list[float]
    weight_version: str | None = "7"


class ScriptedEngine:
    """Answers each generate with the tokens of the next scripted text; records what it was sent."""

    def __init__(self, processor, texts, fail_at: int | None = None):
        self.processor, self.texts, self.fail_at = processor, list(texts), fail_at
        self.calls: list[dict] = []

    async def generate(self, input_ids, *, sampling_params, return_logprob, **media):
        self.calls.append({"input_ids": list(input_ids), **media})
        if self.fail_at is not None and len(self.calls) - 1 == self.fail_at:
            raise ConnectionError("engine went away")
        ids = self.processor.encode_text(self.texts[len(self.calls) - 1]) + [self.processor.eos_token_id]
        return Out(ids, [-0.5] * len(ids))


@pytest.fixture(scope="module")
def processor():
    return build_policy()[1]


def play(env, engine, processor, seed=0):
    return asyncio.run(run_episode(env, engine, processor, seed=seed, group_id=3, sampling_params={"max_new_tokens": 8}))


def test_single_turn_media_env(processor):
    env = relax_gym.make("nextqa-video")
    _, info = env.reset(seed=0)
    engine = ScriptedEngine(processor, [info["gold"]])
    traj = play(env, engine, processor)
    assert traj.reward == 1.0 and traj.status == "ok" and traj.turns == 1 and traj.group_id == 3
    assert len(engine.calls[0]["video_data"]) == 1 and engine.calls[0]["video_data"][0]["url"].startswith("file://")
    assert engine.calls[0]["video_data"][0]["sampling"]["max_frames"] == 16
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    assert len(sampled) == len(processor.encode_text(info["gold"])) + 1  # the answer and its end-of-turn token
    assert all(traj.rollout_logprobs[i] == -0.5 for i in sampled)
    assert sum(1 for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if lp != 0 and not m) == 0
    assert traj.trainable and traj.weight_version == "7"


def test_multi_turn_tool_env_sends_all_media_each_turn(processor):
    env = relax_gym.make("image-zoom")
    _, info = env.reset(seed=4)
    first = info["gold"]
    env.step(first)
    second = env.unwrapped._gold
    engine = ScriptedEngine(processor, [first, second])
    traj = play(env, engine, processor, seed=4)
    assert traj.turns == 2 and traj.reward == 1.0
    assert [len(c["image_data"]) for c in engine.calls] == [1, 2]  # the zoomed image joins the conversation
    assert engine.calls[1]["input_ids"][: len(engine.calls[0]["input_ids"])] == engine.calls[0]["input_ids"]
    assert traj.mm["pixel_values"].shape[0] > 0


def test_engine_failure_masks_the_episode(processor):
    env = relax_gym.make("nextqa-video")
    traj = play(env, ScriptedEngine(processor, ["x"], fail_at=0), processor)
    assert traj.status == "engine_error" and "engine went away" in traj.error and not traj.trainable


def test_env_failure_masks_the_episode(processor, monkeypatch):
    env = relax_gym.make("nextqa-video")
    monkeypatch.setattr(env.unwrapped, "_reset", lambda options: (_ for _ in ()).throw(OSError("disk gone")))
    traj = play(env, ScriptedEngine(processor, ["x"]), processor)
    assert traj.status == "env_error" and "disk gone" in traj.error and not traj.trainable


def test_media_items_cover_every_kind():
    env = relax_gym.make("echo-ink")
    obs, _ = env.reset(seed=0)
    items = media_data(obs)
    assert len(items["image_data"]) == 1 and len(items["audio_data"]) == 1 and "video_data" not in items


class SlowEngine(ScriptedEngine):
    """A scripted engine whose every answer takes ``delay_s``."""

    def __init__(self, processor, texts, delay_s):
        super().__init__(processor, texts)
        self.delay_s = delay_s

    async def generate(self, input_ids, **kwargs):
        await asyncio.sleep(self.delay_s)
        return await super().generate(input_ids, **kwargs)


def test_the_episode_says_where_its_time_went(processor, monkeypatch):
    env = relax_gym.make("image-zoom")
    _, info = env.reset(seed=4)
    first = info["gold"]
    env.step(first)
    second = env.unwrapped._gold
    step = env.step
    monkeypatch.setattr(env, "step", lambda action: (__import__("time").sleep(0.15), step(action))[1])
    traj = play(env, SlowEngine(processor, [first, second], delay_s=0.1), processor, seed=4)
    t = traj.timing
    assert traj.turns == 2 and len(t.generate_s) == 2 and len(t.env_s) == 2
    assert all(g >= 0.1 for g in t.generate_s) and all(e >= 0.15 for e in t.env_s)
    assert all(g < 0.15 for g in t.generate_s)  # the env's wait is not counted as the engine's
    assert t.reset_s > 0 and t.wall_s >= t.reset_s + sum(t.generate_s) + sum(t.env_s)
    from relax_gym.trainer.rollout.samples import summary_dict
    from relax_gym.trainer.run.step_row import timing_metrics

    summary = summary_dict(traj, "s1")
    assert summary["generate_s"] == pytest.approx(sum(t.generate_s)) and summary["wall_s"] == t.wall_s
    row = timing_metrics([summary, {**summary, "wall_s": summary["wall_s"] + 1.0}])
    assert row["time_episode_wall_max_s"] == pytest.approx(t.wall_s + 1.0)
    assert row["time_episode_env_s"] == pytest.approx(sum(t.env_s))


def test_a_failed_engine_call_is_timed_too(processor):
    env = relax_gym.make("nextqa-video")
    traj = play(env, ScriptedEngine(processor, ["x"], fail_at=0), processor)
    assert traj.status == "engine_error" and len(traj.timing.generate_s) == 1 and traj.timing.wall_s > 0
