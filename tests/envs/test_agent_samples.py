"""The agent samples: real layouts read by the same loaders, their own versioned cache folders, deterministic
content, and answers that the first observation does not show but the tools do. The media checks analyse pixels
and waveforms directly; they do not trust the generator's bookkeeping."""

from __future__ import annotations

import csv
import hashlib
from collections import deque
from pathlib import Path

import av
import numpy as np
import pytest

import relax_gym
from relax_gym.envs import samples, synth
from relax_gym.envs.datasets import nextqa_from_dir, r1json_from_dir
from relax_gym.omni import AudioPart, ImagePart

HEADER = "video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4"


def red(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., k].astype(int) for k in range(3))
    return (r > 150) & (g < 100) & (b < 100)


def blue(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., k].astype(int) for k in range(3))
    return (b > 150) & (r < 100) & (g < 130)


def centroid(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    assert len(xs), "no red square"
    return np.array([xs.mean(), ys.mean()])


def components(mask: np.ndarray, min_area: int = 6) -> int:
    seen, count = np.zeros_like(mask), 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        seen[y0, x0], queue, area = True, deque([(y0, x0)]), 0
        while queue:
            y, x = queue.popleft()
            area += 1
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        count += area >= min_area
    return count


def tones(wave: np.ndarray, sr: int = 16000, threshold: float = 0.1) -> list[tuple[int, int]]:
    """Sample ranges where the 5 ms envelope is above ``threshold`` for over 30 ms (beeps and tones, not hum)."""
    win = int(0.005 * sr)
    env = np.convolve(np.abs(wave), np.ones(win) / win, mode="same")
    edges = np.diff(np.concatenate([[0], (env > threshold).astype(int), [0]]))
    return [(s, e) for s, e in zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]) if e - s > int(0.03 * sr)]


def pitch(wave: np.ndarray, sr: int = 16000) -> float:
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave)), n=8 * len(wave)))
    return float(np.fft.rfftfreq(8 * len(wave), 1 / sr)[np.argmax(spectrum)])


@pytest.fixture(scope="module")
def video_env():
    return relax_gym.make("nextqa-video-agent").unwrapped


@pytest.fixture(scope="module")
def av_env():
    return relax_gym.make("echo-ink-agent").unwrapped


def test_cache_folders_carry_their_own_version():
    assert samples.ensure_sample("nextqa-agent").name == f"nextqa-agent-v{synth.AGENT_SAMPLE_VERSION}"
    assert samples.ensure_sample("avqa-agent").name == f"avqa-agent-v{synth.AGENT_SAMPLE_VERSION}"
    assert samples.sample_version("nextqa") == samples.sample_version("avqa") == synth.SAMPLE_VERSION == 4


def test_nextqa_agent_sample_is_the_nextqa_layout():
    root = samples.ensure_sample("nextqa-agent")
    for split, n in (("val", 24), ("train", 48)):
        lines = (root / f"{split}.csv").read_text().splitlines()
        assert lines[0] == HEADER and len(lines) == n + 1
        assert len(nextqa_from_dir(root, split)) == n
    rows = list(csv.DictReader((root / "val.csv").open()))
    assert {r["type"] for r in rows} == {"TN", "DC"} and {r["frame_count"] for r in rows} == {"48"}
    assert (root / "map_vid_vidorID.json").is_file()


def test_avqa_agent_sample_is_the_avqa_layout():
    root = samples.ensure_sample("avqa-agent")
    assert len(r1json_from_dir(root, "valid")) == 24 and len(r1json_from_dir(root, "train")) == 48
    assert (root / "valid" / "omni_rl_format_valid.json").is_file()


def test_generation_is_deterministic(tmp_path: Path):
    for name, writer in (("v", lambda d: synth.write_nextqa_agent_sample(d, n_val=2, n_train=1)),
                         ("a", lambda d: synth.write_avqa_agent_sample(d, n_valid=3, n_train=1))):
        writer(tmp_path / f"{name}1")
        writer(tmp_path / f"{name}2")
        files = sorted(p.relative_to(tmp_path / f"{name}1") for p in (tmp_path / f"{name}1").rglob("*") if p.is_file())
        assert files and all((tmp_path / f"{name}1" / f).read_bytes() == (tmp_path / f"{name}2" / f).read_bytes() for f in files)


def test_single_turn_samples_are_unchanged(tmp_path: Path):
    """The agent writers are additions: the single-turn samples' records depend only on the seeded RNG (avqa: the
    hash taken before the agent samples existed; nextqa: SAMPLE_VERSION 4's, whose val answers are balanced)."""
    synth.write_nextqa_sample(tmp_path / "nq", n_val=6, n_train=2)
    synth.write_avqa_sample(tmp_path / "av", n_valid=6, n_train=3)
    assert hashlib.sha256((tmp_path / "nq" / "val.csv").read_bytes()).hexdigest() == (
        "10614bd34147acc7e91b6d8344c92ad7814516ef6efc5313ff3512d05b211f4a")
    assert hashlib.sha256((tmp_path / "av" / "valid" / "omni_rl_format_valid.json").read_bytes()).hexdigest() == (
        "a38d81ad009cfaedd0cecad8b29ea94971655a83f0c51885ee7d700ef044d97f")


def test_video_answers_lie_between_the_keyframes(video_env):
    for index, sample in enumerate(video_env.samples):
        obs, _ = video_env.reset(options={"index": index})
        keyframes = [p.decode() for p in obs[-1].content if isinstance(p, ImagePart)]
        with av.open(str(sample.media["video"])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(keyframes) == 4 and len(frames) == 48
        answer = sample.options[sample.answer_index]
        # the overview: the red square in one place, no blue square in sight
        spots = np.array([centroid(red(k)) for k in keyframes])
        assert np.abs(spots - spots[0]).max() <= 1.0, (index, spots)
        assert all(blue(k).sum() == 0 for k in keyframes), index
        # the whole clip: the event, away from the frames the overview showed
        offsets = np.array([centroid(red(f)) for f in frames]) - spots[0]
        darting = np.nonzero(np.abs(offsets).max(axis=1) > 3)[0]
        flashing = [i for i, f in enumerate(frames) if blue(f).sum() > 20]
        event = list(darting) + flashing
        keys = synth.keyframe_indices()
        if answer == "it stays still":
            assert not event, index
            continue
        assert event and not set(event) & set(keys) and len({sum(i > k for k in keys) for i in event}) == 1, (index, event)
        if sample.meta["type"] == "TN":
            dx, dy = offsets[darting[np.abs(offsets[darting]).max(axis=1).argmax()]]
            assert max(abs(dx), abs(dy)) >= 15
            seen = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("down" if dy > 0 else "up")
            assert seen == answer, index
        else:
            counts = {components(blue(frames[i])) for i in flashing}
            assert counts == {synth._NUMBER_WORDS.index(answer) + 1}, (index, counts)


def test_the_gold_watch_sees_the_event(video_env):
    for index in (1, 2):  # one flash, one dart
        obs, info = video_env.reset(options={"index": index})
        obs, *_ = video_env.step(info["gold"])
        (video,) = [p for m in obs for p in m.media()]
        frames = video.decode().frames
        still = centroid(red(frames[0]))
        assert any(blue(f).sum() > 20 or np.abs(centroid(red(f)) - still).max() > 3 for f in frames), index


def test_audio_excerpt_lacks_what_decides_the_answer(av_env):
    kinds = set()
    for index, sample in enumerate(av_env.samples):
        obs, _ = av_env.reset(options={"index": index})
        (excerpt,) = [p for p in obs[-1].content if isinstance(p, AudioPart)]
        first = excerpt.decode().waveform
        full = AudioPart.of(sample.media["audio"]).decode().waveform
        answer = sample.options[sample.answer_index]
        assert len(first) == 16000 and len(full) == 48000
        if sample.question.startswith("How many beeps"):
            kinds.add("beeps")
            assert tones(first) == [] and len(tones(full)) == ["one", "two", "three", "four"].index(answer) + 1, index
        elif sample.question.startswith("Is the second tone"):
            kinds.add("pitch")
            found = tones(full)
            assert len(tones(first)) == 1 and all(s >= 16000 for s, _ in found[1:]), index
            if answer == "there is only one tone":
                assert len(found) == 1
            else:
                (s1, e1), (s2, e2) = found
                ratio = pitch(full[s2:e2]) / pitch(full[s1:e1])
                assert {"higher": ratio > 1.2, "lower": ratio < 1 / 1.2, "the same": abs(ratio - 1) < 0.05}[answer], index
        else:
            kinds.add("circles")
            assert components(red(av_env.picture)) == ["one", "two", "three", "four"].index(answer) + 1, index
            assert tones(full) == []
    assert kinds == {"beeps", "pitch", "circles"}
