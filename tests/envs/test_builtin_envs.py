"""The acceptance path of the built-in envs: real decoded media in the observation, honest rewards."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import gymnasium
import numpy as np
import pytest

import relax_gym
from relax_gym.envs import DatasetError, check_env
from relax_gym.envs.multiple_choice import MultipleChoiceEnv
from relax_gym.envs.synth import write_moving_square_video
from relax_gym.omni import AudioPart, ImagePart, VideoPart


def wrong_letter(gold: str, n: int) -> str:
    letter = gold.split("<answer>")[1][0]
    other = "ABCDE"[("ABCDE".index(letter) + 1) % n]
    return f"<think>guess</think><answer>{other}</answer>"


def test_nextqa_video_acceptance():
    env = relax_gym.make("nextqa-video")
    obs, info = env.reset(seed=0)
    videos = [p for m in obs for p in m.content if isinstance(p, VideoPart)]
    assert len(videos) == 1
    decoded = videos[0].decode()
    assert decoded.frames.dtype == np.uint8 and decoded.frames.ndim == 4 and decoded.frames.shape[-1] == 3
    assert decoded.frames.shape[0] >= 8 and len(decoded.timestamps) == decoded.frames.shape[0]
    assert "Options:\nA. " in obs[-1].text and "E. " in obs[-1].text
    _, reward, terminated, truncated, step_info = env.step(info["gold"])
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert step_info["reward_breakdown"] == {"accuracy": 1.0, "format": 1.0}
    env.reset(seed=0)
    _, reward, *_, step_info = env.step(wrong_letter(info["gold"], 5))
    assert step_info["reward_breakdown"]["accuracy"] == 0.0 and reward == pytest.approx(0.1)


def test_echo_ink_acceptance():
    relax_gym.discover()  # gymnasium knows our ids once discovery has run (importing relax_gym does not run it)
    env = gymnasium.make("relax/echo-ink")
    obs, info = env.reset(seed=0)
    user = obs[-1]
    (image,) = [p for p in user.content if isinstance(p, ImagePart)]
    (audio,) = [p for p in user.content if isinstance(p, AudioPart)]
    pixels = image.decode()
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[-1] == 3
    sound = audio.decode()
    assert sound.waveform.dtype == np.float32 and sound.waveform.ndim == 1 and sound.sample_rate == 16000
    assert sound.duration_s > 0.5 and np.abs(sound.waveform).max() > 0.01
    assert "D. " in user.text and "E. " not in user.text
    assert env.step(info["gold"])[1] == 1.0
    env.reset(seed=0)
    _, _, *_, step_info = env.step(wrong_letter(info["gold"], 4))
    assert step_info["reward_breakdown"]["accuracy"] == 0.0


@pytest.mark.parametrize("env_id", ["nextqa-video", "echo-ink"])
def test_builtins_pass_check_env(env_id):
    report = check_env(relax_gym.make(env_id))
    assert "gold action => max reward" in report.passed and "gymnasium env_checker" in report.passed


@pytest.mark.parametrize("action, status", [("", "invalid_action"), ("A" * 1_000_000, "invalid_action"), ("\udcff\x00 <answer>", "ok")])
def test_bad_actions_on_builtin(action, status):
    env = relax_gym.make("nextqa-video")
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(action)
    assert reward == 0.0 and terminated and info["status"] == status


def test_every_sample_question_is_reachable_and_answers_match_gold():
    env = relax_gym.make("nextqa-video").unwrapped
    for i in range(0, len(env.samples), 7):
        obs, info = env.reset(options={"index": i})
        assert info["sample_index"] == i and env.step(info["gold"])[1] == 1.0


def test_someone_elses_nextqa_folder_loads_with_data_dir(tmp_path, nextqa_head_csv):
    """Real CSV rows, videos at other fps and sizes (not our synth settings), flat layout."""
    rows = list(csv.DictReader(nextqa_head_csv.open(newline="")))
    (tmp_path / "videos").mkdir()
    shapes = [(25.0, 96, 72, 50), (12.5, 50, 38, 40), (30.0, 160, 120, 45), (24.0, 64, 48, 30)]
    for r, (fps, w, h, n) in zip(rows, shapes * len(rows)):
        write_moving_square_video(tmp_path / "videos" / f"{r['video']}.mp4", "left", width=w, height=h, fps=fps, frames=n)
    shutil.copy(nextqa_head_csv, tmp_path / "val.csv")
    env = relax_gym.make("nextqa-video", data_dir=str(tmp_path))
    assert len(env.unwrapped.samples) == len(rows)
    for i, (fps, w, h, n) in enumerate(shapes):
        obs, info = env.reset(options={"index": i})
        video = obs[-1].content[0].decode()
        assert video.frames.shape[0] >= 8 and video.frames.shape[1:] == (h, w, 3)
        assert video.native_fps == pytest.approx(fps)
        assert obs[-1].text.startswith(rows[i]["question"])
        assert info["gold"].endswith(f"<answer>{'ABCDE'[int(rows[i]['answer'])]}</answer>")


def test_corrupt_video_fails_at_reset_naming_file_and_row(tmp_path, nextqa_head_csv):
    rows = list(csv.DictReader(nextqa_head_csv.open(newline="")))[:2]
    (tmp_path / "videos").mkdir()
    good = tmp_path / "videos" / f"{rows[0]['video']}.mp4"
    write_moving_square_video(good, "up")
    (tmp_path / "videos" / f"{rows[1]['video']}.mp4").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 3])
    with (tmp_path / "val.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    env = MultipleChoiceEnv(dataset={"format": "nextqa"}, data_dir=tmp_path)
    env.reset(options={"index": 0})
    with pytest.raises(DatasetError) as err:
        env.reset(options={"index": 1})
    assert f"{rows[1]['video']}.mp4" in str(err.value) and "val.csv row 2" in str(err.value)


def test_data_env_without_sample_needs_data_dir():
    with pytest.raises(ValueError, match="pass data_dir="):
        MultipleChoiceEnv(dataset={"format": "jsonl"})
    with pytest.raises(IndexError, match="out of range"):
        relax_gym.make("echo-ink").reset(options={"index": 10_000})


def test_cycle_pick_visits_every_record_once_per_pass():
    env = relax_gym.make("nextqa-video", split="val", pick="cycle")
    n = len(env.unwrapped.samples)
    seen = [env.reset(seed=500_000 + i)[1]["sample_index"] for i in range(n)]
    assert sorted(seen) == list(range(n))  # one pass over the split, each record once
    assert env.reset(seed=500_000 + n)[1]["sample_index"] == seen[0]
    assert env.reset(seed=3, options={"index": 7})[1]["sample_index"] == 7  # an explicit index still wins
    drawn = relax_gym.make("nextqa-video", split="val")  # the default draws with replacement
    assert len({drawn.reset(seed=500_000 + i)[1]["sample_index"] for i in range(n)}) < n
    with pytest.raises(ValueError, match="pick"):
        relax_gym.make("nextqa-video", split="val", pick="sequential")
