"""Caption corpora: the synthetic generators' media, each with a sentence that says what the generator put in it.

A base model learns to perceive from these (``relax_gym.trainer.base``), the way a real omni model learns from
captioned clips before anyone post-trains it on a task. The corpora use the very generators of the QA samples
(:mod:`relax_gym.envs.synth`) but never their questions, options, answer letters or clips:

* ``video-captions``: 64x64 H.264 clips like the ``nextqa`` sample's. A moving red square is captioned with its
  direction ("the red square moves left ." / "the red square stays still ."), a still frame with blue squares with
  their number ("three blue squares ."). Three clips in four are motion clips: motion is what a random vision
  tower is slowest to pick up.
* ``audio-image-captions``: a 64x64 picture and one second of 16 kHz audio like the ``avqa`` sample's, captioned
  with what one of them holds: the number of beeps, the number of red circles, or how the second tone compares with
  the first.

Every clip is drawn from its own seed stream (``CAPTION_SEED``), apart from the QA samples' streams, and lives in
its own folder; ``split`` is ``train`` or ``held`` (a held-out part for the base's own caption accuracy, never a QA
eval clip). Layout::

    <root>/video-captions-v1/captions.jsonl     {"id", "split", "media": {"video": "media/….mp4"}, "caption", "facts"}
    <root>/audio-image-captions-v1/captions.jsonl   … "media": {"image": "media/….jpg", "audio": "media/….wav"} …
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from relax_gym.envs import synth

__all__ = [
    "CAPTION_SAMPLES",
    "CAPTION_SEED",
    "audio_image_caption",
    "count_caption",
    "motion_caption",
    "write_audio_image_captions",
    "write_video_captions",
]

#: Seed of the caption corpora's random streams (the QA samples use 0, 1 and 5).
CAPTION_SEED = 20_261_201
#: Caption sample name -> its folder's version.
CAPTION_SAMPLES: dict[str, int] = {"video-captions": 1, "audio-image-captions": 1}

_NUMBERS = ("one", "two", "three", "four", "five")


def motion_caption(direction: str) -> str:
    return "the red square stays still ." if direction == "still" else f"the red square moves {direction} ."


def count_caption(n: int, noun: str) -> str:
    return f"{_NUMBERS[n - 1]} {noun}{'s' if n > 1 else ''} ."


def audio_image_caption(kind: str, value: int | str) -> str:
    if kind == "beeps":
        return count_caption(int(value), "beep")
    if kind == "circles":
        return count_caption(int(value), "red circle")
    return {"higher": "the second tone is higher .", "lower": "the second tone is lower .",
            "the same": "the two tones are the same .", "there is only one tone": "there is only one tone ."}[str(value)]


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def write_video_captions(dest: Path, n_train: int = 2000, n_held: int = 100, seed: int = CAPTION_SEED) -> None:
    """``n_train`` + ``n_held`` captioned clips (64x64, 8 fps, 16 frames); held-out clips alternate motion / count
    and cycle through every direction and number, so the held-out accuracy has no easy constant."""
    dest = Path(dest)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n_train + n_held):
        held = i >= n_train
        clip_seed = int(rng.integers(0, 2**31 - 1))
        motion = (i % 2 == 0) if held else bool(rng.random() < 0.75)
        rel = f"media/{i // 100:03d}/clip{i:05d}.mp4"
        if motion:
            direction = synth.DIRECTIONS[(i // 2) % 5 if held else int(rng.integers(5))]
            synth.write_moving_square_video(dest / rel, direction, seed=clip_seed)
            caption, facts = motion_caption(direction), {"motion": direction}
        else:
            n = ((i // 2) % 5 if held else int(rng.integers(5))) + 1
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            synth._write_count_video(dest / rel, n, clip_seed)
            caption, facts = count_caption(n, "blue square"), {"blue_squares": n}
        records.append({"id": i, "split": "held" if held else "train", "media": {"video": rel}, "caption": caption,
                        "facts": facts})
    _write_jsonl(dest / "captions.jsonl", records)


def write_audio_image_captions(dest: Path, n_train: int = 1500, n_held: int = 90, seed: int = CAPTION_SEED + 1) -> None:
    """``n_train`` + ``n_held`` captioned (picture, audio) pairs, rotating between beeps to count (filler picture),
    red circles to count (a hum), and two tones to compare (filler picture)."""
    dest = Path(dest)
    (dest / "media").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n_train + n_held):
        kind = ("beeps", "circles", "pitch")[i % 3]
        if kind == "beeps":
            value: int | str = int(rng.integers(1, 5))
            audio, image = synth._beeps_audio(rng, int(value)), synth._random_shapes_image(rng)
        elif kind == "circles":
            value = int(rng.integers(1, 5))
            audio, image = synth._hum_audio(rng), synth._circles_image(rng, int(value))
        else:
            value = synth.PITCH_OPTIONS[int(rng.integers(len(synth.PITCH_OPTIONS)))]
            audio, image = synth._pitch_audio(rng, str(value)), synth._random_shapes_image(rng)
        image_rel, audio_rel = f"media/pair{i:05d}.jpg", f"media/pair{i:05d}.wav"
        image.save(dest / image_rel, format="JPEG", quality=90)
        sf.write(dest / audio_rel, np.clip(audio, -1.0, 1.0), 16_000, subtype="PCM_16", format="WAV")
        records.append({"id": i, "split": "held" if i >= n_train else "train",
                        "media": {"image": image_rel, "audio": audio_rel},
                        "caption": audio_image_caption(kind, value), "facts": {kind: value}})
    _write_jsonl(dest / "captions.jsonl", records)
