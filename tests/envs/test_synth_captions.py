"""The caption corpora a base learns from: each caption is true to its media, and none carries QA text."""

from __future__ import annotations

import json

import numpy as np

from relax_gym.envs import samples, synth
from relax_gym.envs.synth_captions import (
    CAPTION_SAMPLES,
    audio_image_caption,
    motion_caption,
    write_audio_image_captions,
    write_video_captions,
)
from relax_gym.omni import VideoPart


def _records(folder):
    return [json.loads(line) for line in (folder / "captions.jsonl").read_text().splitlines()]


def _red_centre(frame: np.ndarray) -> np.ndarray:
    r, g, b = (frame[..., k].astype(int) for k in range(3))
    ys, xs = np.nonzero((r > 150) & (g < 90) & (b < 90))
    return np.array([xs.mean(), ys.mean()])


def test_video_captions_say_what_the_clip_shows(tmp_path):
    write_video_captions(tmp_path, n_train=6, n_held=10)
    records = _records(tmp_path)
    assert [r["split"] for r in records] == ["train"] * 6 + ["held"] * 10
    held = [r for r in records if r["split"] == "held"]
    # the held-out part alternates motion / count and cycles through every direction and every number
    assert {r["facts"]["motion"] for r in held if "motion" in r["facts"]} == set(synth.DIRECTIONS)
    assert {r["facts"]["blue_squares"] for r in held if "blue_squares" in r["facts"]} == {1, 2, 3, 4, 5}
    step = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}
    for r in records:
        frames = VideoPart.of(str(tmp_path / r["media"]["video"])).decode(cache=None).frames
        if "motion" in r["facts"]:
            d = r["facts"]["motion"]
            assert r["caption"] == motion_caption(d)
            moved = _red_centre(frames[-1]) - _red_centre(frames[0])
            if d == "still":
                assert np.abs(moved).max() <= 4, (r, moved)  # 1 px of jitter, blurred by the codec
            else:  # ~30 px the captioned way, ~0 across
                across = moved[0] * step[d][1] - moved[1] * step[d][0]
                assert np.dot(moved, step[d]) > 20 and abs(across) <= 4, (r, moved)
        else:
            n = r["facts"]["blue_squares"]
            assert r["caption"].startswith(("one ", "two ", "three ", "four ", "five ")[n - 1])


def test_audio_image_captions_follow_their_facts(tmp_path):
    write_audio_image_captions(tmp_path, n_train=6, n_held=3)
    records = _records(tmp_path)
    assert len(records) == 9 and {r["split"] for r in records} == {"train", "held"}
    for r in records:
        (kind, value), = r["facts"].items()
        assert r["caption"] == audio_image_caption(kind, value)
        assert (tmp_path / r["media"]["image"]).stat().st_size > 0 and (tmp_path / r["media"]["audio"]).stat().st_size > 0
    assert audio_image_caption("beeps", 3) == "three beeps ." and audio_image_caption("circles", 1) == "one red circle ."


def test_captions_carry_no_question_options_or_answer_letters(tmp_path):
    write_video_captions(tmp_path / "v", n_train=20, n_held=10)
    write_audio_image_captions(tmp_path / "a", n_train=12, n_held=6)
    texts = [r["caption"] for r in _records(tmp_path / "v") + _records(tmp_path / "a")]
    questions = (synth.TN_QUESTION, synth.DC_QUESTION, synth.BEEP_QUESTION, synth.CIRCLE_QUESTION, synth.PITCH_QUESTION)
    for t in texts:
        assert "<answer>" not in t and "?" not in t and "option" not in t.lower()
        assert not any(q.lower().rstrip("?") in t.lower() for q in questions)
        assert not any(f"{letter}." in t.split() or letter in t.split() for letter in "ABCDE")


def test_caption_samples_are_cached_samples_with_their_own_version():
    assert set(CAPTION_SAMPLES) <= set(samples.SAMPLE_NAMES)
    assert all(samples.sample_version(n) == v for n, v in CAPTION_SAMPLES.items())
