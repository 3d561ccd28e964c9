"""nextqa-video-agent and echo-ink-agent: the opening, the media tools, their errors and budgets, the reward with
its optional call cost, media routed as tool or user messages, and `relax-gym envs play` showing the tool calls."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs import DatasetError, check_env
from relax_gym.omni import AudioPart, ImagePart, VideoPart, dumps, loads

AGENT_IDS = ["nextqa-video-agent", "echo-ink-agent"]


def call(name: str, **arguments) -> str:
    return f'<think>look</think><tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def media_of(messages) -> list:
    return [p for m in messages for p in m.media()]


@pytest.fixture(scope="module")
def video_env():
    env = relax_gym.make("nextqa-video-agent")
    yield env
    env.close()


@pytest.fixture(scope="module")
def av_env():
    env = relax_gym.make("echo-ink-agent")
    yield env
    env.close()


@pytest.mark.parametrize("env_id", AGENT_IDS)
def test_check_env_passes(env_id):
    report = check_env(relax_gym.make(env_id))
    assert "gold action => max reward" in report.passed and "gymnasium env_checker" in report.passed


@pytest.mark.parametrize("env_id", AGENT_IDS)
def test_gold_uses_the_tools_then_answers(env_id):
    env = relax_gym.make(env_id)
    obs, info = env.reset(seed=4)
    turns, returned = 0, []
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(info["gold"])
        turns += 1
        returned += media_of(obs)
        done = terminated or truncated
    assert turns >= 2 and info["tool_calls"] == turns - 1 and info["tool_errors"] == 0
    assert reward == 1.0 and info["reward_breakdown"]["accuracy"] == 1.0 and info["status"] == "ok"
    assert returned and all(p.decode() is not None for p in returned)
    # every returned part is still in the episode's history, after the final turn
    history_media = media_of(env.unwrapped.history)
    assert all(any(p is q for q in history_media) for p in returned)


def test_video_opening_shows_keyframes_and_duration_only(video_env):
    obs, info = video_env.reset(seed=0)
    user = obs[-1]
    images = [p for p in user.content if isinstance(p, ImagePart)]
    assert len(images) == 4 and not any(isinstance(p, VideoPart) for p in user.content)
    assert all(img.decode().shape == (64, 64, 3) for img in images)
    text = user.text
    assert "A video clip of 6.00 s (8 fps)" in text
    assert [f"t={t}s" in text for t in ("0.75", "2.25", "3.75", "5.25")] == [True] * 4
    assert "Question: " in text and ("E. it stays still" in text or "E. five" in text)


def test_watch_returns_the_span_as_video_and_frame_one_image(video_env):
    video_env.reset(seed=0)
    obs, reward, terminated, _, info = video_env.step(call("watch", start_s=1.0, end_s=3.0, fps=4))
    assert (reward, terminated, info["tool_errors"]) == (0.0, False, 0)
    (tool_msg,) = obs
    assert tool_msg.role == "tool" and tool_msg.name == "watch"
    (part,) = media_of(obs)
    video = part.decode()
    assert isinstance(part, VideoPart) and video.frames.shape == (8, 64, 64, 3)
    assert 1.0 <= video.timestamps[0] < video.timestamps[-1] < 3.0
    assert "8 frames from 1.12 s to 2.88 s (24 of 32 frames left)" in tool_msg.text
    obs, *_ = video_env.step(call("frame", t_s=2.5))
    (image,) = media_of(obs)
    assert isinstance(image, ImagePart) and image.decode().shape == (64, 64, 3)
    assert "the frame at 2.50 s (23 frames left)" in obs[0].text


BAD_VIDEO_CALLS = [
    (call("watch", start_s=0, end_s=9, fps=2), "end_s=9 is past the end of the clip (6.00 s)"),
    (call("watch", start_s=7, end_s=8, fps=2), "start_s=7 is at or past the end of the clip"),
    (call("watch", start_s=3, end_s=1, fps=2), "end_s=1 must be greater than start_s=3"),
    (call("watch", start_s=0, end_s=1, fps=30), "fps=30 is above the limit of 8 frames per second"),
    (call("watch", start_s=-1, end_s=1, fps=2), "start_s: Input should be greater than or equal to 0"),
    (call("watch", start_s=0, end_s=1, fps=0), "fps: Input should be greater than 0"),
    ('<tool_call>{"name": "watch", "arguments": {"start_s": 0, "end_s": 1, "fps": NaN}}</tool_call>', "fps: Input should be a finite number"),
    (call("watch", start_s="soon", end_s=1), "start_s: Input should be a valid number"),
    (call("watch", start_s=0), "end_s: Field required"),
    (call("watch", start_s=0, end_s=1, speed=2), "speed: Extra inputs are not permitted"),
    (call("watch", start_s=0, end_s=6, fps=8), "watch(start_s=0, end_s=6, fps=8) needs 48 frames, more than one call may take (16); lower fps or shorten end_s - start_s"),
    (call("frame", t_s=6), "t_s=6 is at or past the end of the clip (6.00 s)"),
]


@pytest.mark.parametrize("action, message", BAD_VIDEO_CALLS, ids=[m[:30] for _, m in BAD_VIDEO_CALLS])
def test_bad_video_tool_calls_are_one_clear_error(video_env, action, message):
    video_env.reset(seed=2)
    obs, reward, terminated, truncated, info = video_env.step(action)
    assert (reward, terminated, truncated, info["status"]) == (0.0, False, False, "ok")
    assert info["tool_errors"] == 1 and len(obs) == 1 and not media_of(obs)
    assert obs[0].text.count("Error:") == 1 and message in obs[0].text, obs[0].text


def test_frame_budget_spans_calls_and_resets_per_episode(video_env):
    video_env.reset(seed=1)
    for _ in range(2):
        obs, *_, info = video_env.step(call("watch", start_s=0, end_s=6, fps=2.66))  # 15 frames each
        assert info["tool_errors"] == 0
    obs, *_, info = video_env.step(call("watch", start_s=0, end_s=2, fps=2))  # 4 more: only 2 left
    assert info["tool_errors"] == 1
    assert "needs 4 frames, but only 2 of this episode's 32 are left" in obs[0].text
    obs, *_, info = video_env.step(call("frame", t_s=1))
    assert info["tool_errors"] == 1 and "1 frames left" in obs[0].text
    video_env.reset(seed=1)
    _, *_, info = video_env.step(call("watch", start_s=0, end_s=6, fps=2.66))
    assert info["tool_errors"] == 0


def test_av_opening_has_the_low_res_image_and_the_excerpt(av_env):
    obs, _ = av_env.reset(seed=0)
    user = obs[-1]
    (image,) = [p for p in user.content if isinstance(p, ImagePart)]
    (audio,) = [p for p in user.content if isinstance(p, AudioPart)]
    assert image.decode().shape == (32, 32, 3) and av_env.unwrapped.picture.shape == (128, 128, 3)
    assert audio.decode().duration_s == pytest.approx(1.0)
    assert "An image of 128x128 pixels, shown here at 32x32" in user.text
    assert "The first 1.00 s of a 3.00 s audio clip" in user.text


def test_listen_and_zoom_return_the_requested_media(av_env):
    av_env.reset(seed=0)
    obs, *_, info = av_env.step(call("listen", start_s=1.5, end_s=2.5))
    (audio,) = media_of(obs)
    decoded = audio.decode()
    assert isinstance(audio, AudioPart) and decoded.duration_s == pytest.approx(1.0) and decoded.sample_rate == 16000
    full = AudioPart.of(av_env.unwrapped.sample.media["audio"]).decode().waveform
    assert np.allclose(decoded.waveform, full[24000:40000], atol=1e-4)
    obs, *_, info = av_env.step(call("zoom", x=10, y=20, w=30, h=40))
    (image,) = media_of(obs)
    assert np.array_equal(image.decode(), av_env.unwrapped.picture[20:60, 10:40])
    assert info["tool_errors"] == 0 and "region x=10..40, y=20..60" in obs[0].text


BAD_AV_CALLS = [
    (call("listen", start_s=0, end_s=4), "end_s=4 is past the end of the audio (3.00 s)"),
    (call("listen", start_s=3, end_s=3.5), "start_s=3 is at or past the end of the audio"),
    (call("listen", start_s=1, end_s=1.05), "shorter than the minimum span of 0.1 s"),
    (call("listen", start_s=2, end_s=1), "end_s=1 must be greater than start_s=2"),
    (call("zoom", x=200, y=0, w=8, h=8), "x=200 lies outside the image (width 128)"),
    (call("zoom", x=0, y=130, w=8, h=8), "y=130 lies outside the image (height 128)"),
    (call("zoom", x=0, y=0, w=2, h=8), "w=2 is below the smallest region side of 4 pixels"),
    (call("zoom", x=120, y=0, w=16, h=8), "w=16: the region x..x+w = 120..136 runs past the image's right edge (128)"),
    (call("zoom", x=0, y=100, w=8, h=40), "h=40: the region y..y+h = 100..140 runs past the image's bottom edge (128)"),
    (call("zoom", x=-1, y=0, w=8, h=8), "x: Input should be greater than or equal to 0"),
    (call("zoom", x=1.5, y=0, w=8, h=8), "x: Input should be a valid integer"),
    (call("listen", start_s=0), "end_s: Field required"),
]


@pytest.mark.parametrize("action, message", BAD_AV_CALLS, ids=[m[:30] for _, m in BAD_AV_CALLS])
def test_bad_av_tool_calls_are_one_clear_error(av_env, action, message):
    av_env.reset(seed=2)
    obs, reward, terminated, truncated, info = av_env.step(action)
    assert (reward, terminated, truncated, info["status"]) == (0.0, False, False, "ok")
    assert info["tool_errors"] == 1 and len(obs) == 1 and not media_of(obs)
    assert obs[0].text.count("Error:") == 1 and message in obs[0].text, obs[0].text


def test_listen_limits_per_call_and_per_episode():
    env = relax_gym.make("echo-ink-agent", max_listen_s=1.5, listen_budget_s=2.0, max_turns=6)
    env.reset(seed=0)
    obs, *_, info = env.step(call("listen", start_s=0, end_s=2))
    assert info["tool_errors"] == 1 and "is longer than one call may cover (1.5 s)" in obs[0].text
    _, *_, info = env.step(call("listen", start_s=0, end_s=1.5))
    assert info["tool_errors"] == 1
    obs, *_, info = env.step(call("listen", start_s=1.5, end_s=2.5))
    assert info["tool_errors"] == 2 and "only 0.5 of this episode's 2 are left" in obs[0].text


def test_call_cost_beyond_the_free_calls():
    env = relax_gym.make("nextqa-video-agent", call_cost=0.1, free_calls=0)
    _, info = env.reset(seed=0)
    _, _, _, _, info = env.step(info["gold"])
    _, reward, *_, info = env.step(info["gold"])
    assert reward == pytest.approx(0.9) and info["reward_breakdown"] == {"accuracy": 1.0, "format": 1.0, "call_cost": pytest.approx(0.1)}

    env = relax_gym.make("nextqa-video-agent")  # manifest: 0.05 per call beyond 2 free ones
    _, info = env.reset(seed=0)
    gold = info["gold"]
    for _ in range(3):
        _, _, _, _, info = env.step(call("frame", t_s=1))
    _, reward, *_, info = env.step(info["gold"])
    assert reward == pytest.approx(0.95) and info["reward_breakdown"]["call_cost"] == pytest.approx(0.05)
    assert gold.startswith("<think>") and '"name": "watch"' in gold

    env = relax_gym.make("nextqa-video-agent", call_cost=1.0, free_calls=0)  # never below zero
    _, info = env.reset(seed=0)
    env.step(info["gold"])
    _, reward, *_, info = env.step("<think>x</think><answer>Z</answer>")  # format only: 0.1, all of it taken
    assert reward == 0.0 and info["reward_breakdown"] == {"accuracy": 0.0, "format": 1.0, "call_cost": pytest.approx(0.1)}


def test_media_can_ride_in_a_user_message_after_the_tool_message():
    env = relax_gym.make("echo-ink-agent", media_role="user")
    _, info = env.reset(seed=3)
    obs, *_, info = env.step(info["gold"])
    tool_msg, media_msg = obs
    assert tool_msg.role == "tool" and not tool_msg.media() and "(audio in the next message)" in tool_msg.text
    assert media_msg.role == "user" and [p.kind for p in media_msg.media()] == ["audio"]
    assert "Media returned by listen:" in media_msg.text
    _, *_, info = env.step(info["gold"])
    _, reward, *_ = env.step(info["gold"])
    assert reward == 1.0
    with pytest.raises(ValueError, match="media_role"):
        relax_gym.make("echo-ink-agent", media_role="system")


@pytest.mark.parametrize("env_id", AGENT_IDS)
def test_whole_episode_round_trips_through_json(env_id):
    env = relax_gym.make(env_id)
    _, info = env.reset(seed=5)
    done = False
    while not done:
        _, _, terminated, truncated, info = env.step(info["gold"])
        done = terminated or truncated
    history = env.unwrapped.history
    again = loads(dumps(history))
    assert again == history
    assert [p.kind for p in media_of(again)] == [p.kind for p in media_of(history)]


def test_split_and_index_pick_records():
    env = relax_gym.make("nextqa-video-agent", split="train").unwrapped
    assert len(env.samples) == 48
    _, info = env.reset(options={"index": 47})
    assert info["sample_index"] == 47 and info["origin"] == "train.csv row 48"
    with pytest.raises(IndexError, match="out of range 0..47"):
        env.reset(options={"index": 48})


def test_corrupt_video_fails_at_reset_naming_file_and_record(tmp_path):
    from relax_gym.envs import samples

    src = samples.ensure_sample("nextqa-agent")
    data = tmp_path / "nextqa"
    shutil.copytree(src, data)
    env = relax_gym.make("nextqa-video-agent", data_dir=str(data)).unwrapped
    victim = env.samples[3].media["video"]
    victim.write_bytes(victim.read_bytes()[:200])
    with pytest.raises(DatasetError) as err:
        env.reset(options={"index": 3})
    assert str(victim) in str(err.value) and "val.csv row 4" in str(err.value)


def test_play_shows_each_tool_call_and_the_media_it_returned():
    runner = CliRunner()
    result = runner.invoke(app, ["envs", "play", "nextqa-video-agent", "--episodes", "2"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert out.count("tool calls") == 2 and out.count("watch ok ") == 2
    assert "video 15 frames 64x64, 0.25-5.75 s of 6.00 s" in out
    assert "mean return over 2 episode(s): 1.000" in out
    result = runner.invoke(app, ["envs", "play", "echo-ink-agent"])
    out = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "listen ok" in out and "audio 0.00-3.00 s (3.00 s @ 16000 Hz)" in out
    assert "zoom ok" in out and "image 128x128" in out
    assert "mean return over 1 episode(s): 1.000" in out
