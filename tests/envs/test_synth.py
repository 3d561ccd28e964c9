"""Tests for the synthetic sample datasets: layout, determinism, and that the media carries the answer."""

from __future__ import annotations

import csv
import json
from collections import Counter, deque
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from relax_gym.envs import samples, synth

MB = 1024 * 1024
NEXTQA_HEADER = "video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4"
AVQA_FIELDS = {
    "problem_id",
    "problem",
    "data_type",
    "problem_type",
    "qa_type",
    "options",
    "solution",
    "path",
    "data_source",
}


# ------------------------------------------------------------------------------------------
# media analysis helpers (independent of the generator's internals)
# ------------------------------------------------------------------------------------------


def _components(mask: np.ndarray, min_area: int = 6) -> list[list[tuple[int, int]]]:
    """4-connected components of a boolean mask (flood fill), ignoring specks below ``min_area``."""
    seen = np.zeros_like(mask, dtype=bool)
    h, w = mask.shape
    comps = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue, comp = deque([(int(y0), int(x0))]), []
        while queue:
            y, x = queue.popleft()
            comp.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        if len(comp) >= min_area:
            comps.append(comp)
    return comps


def _red_mask(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., k].astype(int) for k in range(3))
    return (r > 150) & (g < 100) & (b < 100)


def _blue_mask(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., k].astype(int) for k in range(3))
    return (b > 150) & (r < 100) & (g < 130)


def _decode_frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def _centroid(mask: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(mask)
    assert len(xs) > 0, "red square not found"
    return float(xs.mean()), float(ys.mean())


def _direction_of(path: Path) -> str:
    frames = _decode_frames(path)
    x0, y0 = _centroid(_red_mask(frames[0]))
    x1, y1 = _centroid(_red_mask(frames[-1]))
    dx, dy = x1 - x0, y1 - y0
    if abs(dx) <= 2 and abs(dy) <= 2:
        return "it stays still"
    assert max(abs(dx), abs(dy)) >= 20, (dx, dy)
    if abs(dx) > abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def _segments(wave: np.ndarray, sr: int, threshold: float = 0.1) -> list[tuple[int, int]]:
    """Sample ranges where the 5 ms mean-absolute envelope exceeds ``threshold``."""
    win = int(0.005 * sr)
    env = np.convolve(np.abs(wave), np.ones(win) / win, mode="same")
    on = np.concatenate([[False], env > threshold, [False]]).astype(int)
    edges = np.diff(on)
    starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
    return [(int(s), int(e)) for s, e in zip(starts, ends) if e - s > int(0.03 * sr)]


def _dominant_hz(wave: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave)), n=8 * len(wave)))
    return float(np.fft.rfftfreq(8 * len(wave), 1 / sr)[np.argmax(spectrum)])


def _pitch_answer(wave: np.ndarray, sr: int) -> str:
    segs = _segments(wave, sr)
    if len(segs) == 1:
        return "there is only one tone"
    assert len(segs) == 2, segs
    f1, f2 = (_dominant_hz(wave[s:e], sr) for s, e in segs)
    if f2 > f1 * 1.2:
        return "higher"
    if f2 < f1 / 1.2:
        return "lower"
    assert abs(f2 - f1) < 0.05 * f1
    return "the same"


_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _avqa_answer(item: dict) -> str:
    letter = item["solution"].removeprefix("<answer>").removesuffix("</answer>")
    option = item["options"]["ABCD".index(letter)]
    assert option.startswith(f"{letter}. ")
    return option[3:]


# ------------------------------------------------------------------------------------------
# fixtures: the full default-size samples, through ensure_sample into the suite's sample cache
# ------------------------------------------------------------------------------------------
# The same folders the nextqa-video and echo-ink envs read (their manifests name these samples), so the suite
# generates each once, here or in whichever env test comes first, and checks here what the envs are given. A
# writer change comes with a new SAMPLE_VERSION (a new folder); a fresh clone starts from an empty cache.


@pytest.fixture(scope="module")
def nextqa() -> Path:
    return samples.ensure_sample("nextqa")


@pytest.fixture(scope="module")
def avqa() -> Path:
    return samples.ensure_sample("avqa")


# ------------------------------------------------------------------------------------------
# NExT-QA layout
# ------------------------------------------------------------------------------------------


def test_nextqa_layout(nextqa: Path) -> None:
    assert nextqa.name == f"nextqa-v{synth.SAMPLE_VERSION}"
    vid_map = json.loads((nextqa / "map_vid_vidorID.json").read_text())
    seen_videos: set[str] = set()
    for split, n in (("val", 200), ("train", 2000)):
        text = (nextqa / f"{split}.csv").read_text()
        assert text.splitlines()[0] == NEXTQA_HEADER
        rows = _read_csv(nextqa / f"{split}.csv")
        assert len(rows) == n
        types = [r["type"] for r in rows]
        assert set(types) == {"TN", "DC"}
        assert abs(types.count("TN") - types.count("DC")) <= 1
        for row in rows:
            assert row["video"].isdigit() and len(row["video"]) == 10
            assert row["video"] not in seen_videos
            seen_videos.add(row["video"])
            assert (row["frame_count"], row["width"], row["height"]) == ("16", "64", "64")
            assert int(row["qid"]) >= 0
            answer = int(row["answer"])
            assert 0 <= answer <= 4
            options = [row[f"a{k}"] for k in range(5)]
            if row["type"] == "TN":
                assert row["question"] == "which way does the red square move"
                assert sorted(options) == sorted(["left", "right", "up", "down", "it stays still"])
            else:
                assert row["question"] == "how many blue squares are there"
                assert sorted(options) == sorted(["one", "two", "three", "four", "five"])
            rel = vid_map[row["video"]]
            folder, vid = rel.split("/")
            assert vid == row["video"]
            assert (nextqa / "videos" / folder / f"{vid}.mp4").is_file()
    assert set(vid_map) == seen_videos
    # answers are spread over the slots: the media decide them, not a constant letter
    rows = _read_csv(nextqa / "train.csv")
    assert len({r["answer"] for r in rows}) >= 4
    # the val split is balanced: a constant letter scores chance on it (20 of each answer per question type)
    val = Counter((r["type"], r["answer"]) for r in _read_csv(nextqa / "val.csv"))
    assert set(val.values()) == {20} and len(val) == 10
    assert _dir_size(nextqa) < 12 * MB


def test_nextqa_video_format(nextqa: Path) -> None:
    row = _read_csv(nextqa / "val.csv")[0]
    rel = json.loads((nextqa / "map_vid_vidorID.json").read_text())[row["video"]]
    with av.open(str(nextqa / "videos" / f"{rel}.mp4")) as container:
        assert len(container.streams.video) == 1 and len(container.streams.audio) == 0
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert (stream.codec_context.width, stream.codec_context.height) == (64, 64)
        assert stream.average_rate == 8
        frames = list(container.decode(stream))
    assert len(frames) == 16
    assert frames[0].format.name == "yuv420p"


def test_nextqa_media_carries_answer(nextqa: Path) -> None:
    vid_map = json.loads((nextqa / "map_vid_vidorID.json").read_text())
    rows = _read_csv(nextqa / "val.csv")
    seen_answers: dict[str, set[str]] = {"TN": set(), "DC": set()}
    for row in rows:
        path = nextqa / "videos" / f"{vid_map[row['video']]}.mp4"
        answer = row[f"a{row['answer']}"]
        seen_answers[row["type"]].add(answer)
        if row["type"] == "TN":
            assert _direction_of(path) == answer, row
        else:
            frames = _decode_frames(path)
            for frame in (frames[0], frames[-1]):
                assert len(_components(_blue_mask(frame))) == _WORDS[answer], row
                assert len(_components(_red_mask(frame))) == 1, row
    # the sample exercises (nearly) every answer
    assert len(seen_answers["TN"]) >= 4 and len(seen_answers["DC"]) >= 4


@pytest.mark.parametrize("direction", ["left", "right", "up", "down", "still"])
def test_moving_square_direction(tmp_path: Path, direction: str) -> None:
    path = tmp_path / f"{direction}.mp4"
    synth.write_moving_square_video(path, direction, seed=3)
    expected = "it stays still" if direction == "still" else direction
    assert _direction_of(path) == expected
    frames = _decode_frames(path)
    assert len(frames) == 16
    if direction == "still":
        cs = [_centroid(_red_mask(f)) for f in frames]
        assert max(abs(a - b) for c in cs for a, b in zip(c, cs[0])) <= 1.5


def test_moving_square_with_audio(tmp_path: Path) -> None:
    path = tmp_path / "av.mp4"
    synth.write_moving_square_video(path, "right", with_audio_hz=440)
    with av.open(str(path)) as container:
        assert len(container.streams.video) == 1
        assert len(container.streams.audio) == 1
        astream = container.streams.audio[0]
        assert astream.codec_context.name == "aac"
        assert astream.codec_context.channels == 1
        sr = astream.codec_context.sample_rate
        audio = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert len(audio) / sr == pytest.approx(2.0, abs=0.15)
    # skip the encoder priming / edges and check the tone
    middle = audio[int(0.5 * sr) : int(1.5 * sr)]
    assert _dominant_hz(middle, sr) == pytest.approx(440, abs=5)


def test_moving_square_rejects_bad_direction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="direction"):
        synth.write_moving_square_video(tmp_path / "x.mp4", "sideways")


# ------------------------------------------------------------------------------------------
# AVQA layout
# ------------------------------------------------------------------------------------------


def test_avqa_layout(avqa: Path) -> None:
    assert avqa.name == f"avqa-v{synth.SAMPLE_VERSION}"
    for split, n in (("valid", 48), ("train", 600)):
        items = json.loads((avqa / split / f"omni_rl_format_{split}.json").read_text())
        assert len(items) == n
        assert [it["problem_id"] for it in items] == list(range(n))
        for item in items:
            assert set(item) == AVQA_FIELDS
            assert item["data_type"] == "image_audio"
            assert item["problem_type"] == "multiple choice"
            assert item["qa_type"] == "avqa"
            assert item["data_source"] == "relax-gym-synth"
            assert [o[:3] for o in item["options"]] == ["A. ", "B. ", "C. ", "D. "]
            assert item["solution"] in {f"<answer>{c}</answer>" for c in "ABCD"}
            image = avqa / split / item["path"]["image"]
            audio = avqa / split / item["path"]["audio"]
            assert item["path"]["image"].startswith("images/") and image.is_file()
            assert item["path"]["audio"].startswith("audios/") and audio.is_file()
        kinds = {it["problem"] for it in items}
        assert kinds == {
            "How many beeps do you hear?",
            "How many red circles are in the picture?",
            "Is the second tone higher or lower than the first?",
        }
    # 144 one-second 16 kHz PCM_16 WAVs are ~32 KB each, so this sample is ~4.9 MB in total;
    # the audio dominates and cannot shrink without changing the specified format.
    assert _dir_size(avqa) < 32 * MB


def test_avqa_media_format(avqa: Path) -> None:
    item = json.loads((avqa / "valid" / "omni_rl_format_valid.json").read_text())[0]
    with Image.open(avqa / "valid" / item["path"]["image"]) as img:
        assert img.format == "JPEG" and img.size == (64, 64) and img.mode == "RGB"
    info = sf.info(str(avqa / "valid" / item["path"]["audio"]))
    assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "WAV")
    assert 1.0 <= info.duration <= 1.5


def test_avqa_media_carries_answer(avqa: Path) -> None:
    answers: dict[str, set[str]] = {}
    for split in ("valid", "train"):
        for item in json.loads((avqa / split / f"omni_rl_format_{split}.json").read_text()):
            answer = _avqa_answer(item)
            answers.setdefault(item["problem"], set()).add(answer)
            wave, sr = sf.read(str(avqa / split / item["path"]["audio"]))
            if item["problem"] == "How many beeps do you hear?":
                assert len(_segments(wave, sr)) == _WORDS[answer], item
            elif item["problem"] == "How many red circles are in the picture?":
                rgb = np.asarray(Image.open(avqa / split / item["path"]["image"]).convert("RGB"))
                assert len(_components(_red_mask(rgb))) == _WORDS[answer], item
            else:
                assert _pitch_answer(wave, sr) == answer, item
    assert answers["How many beeps do you hear?"] == {"one", "two", "three", "four"}
    assert answers["How many red circles are in the picture?"] == {"one", "two", "three", "four"}
    assert answers["Is the second tone higher or lower than the first?"] == {
        "higher",
        "lower",
        "the same",
        "there is only one tone",
    }


# ------------------------------------------------------------------------------------------
# determinism
# ------------------------------------------------------------------------------------------


def test_nextqa_deterministic(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synth.write_nextqa_sample(a, n_val=6, n_train=6, seed=5)
    synth.write_nextqa_sample(b, n_val=6, n_train=6, seed=5)
    synth.write_nextqa_sample(c, n_val=6, n_train=6, seed=6)
    for name in ("val.csv", "train.csv", "map_vid_vidorID.json"):
        assert (a / name).read_text() == (b / name).read_text()
    # another seed: other training answers and other clips (val's answers are balanced, the same for any seed)
    assert (a / "train.csv").read_text() != (c / "train.csv").read_text()
    files = sorted(p.relative_to(a) for p in a.rglob("*.mp4"))
    assert len(files) == 12
    # the same seed gives the same pictures. (Byte-identical files were asserted here until a full-suite run showed
    # a pair that differed once in ~10 runs; what the envs see is the decoded frames, compared up to codec noise.)
    def gap(x: Path, y: Path) -> int:
        fx, fy = _decode_frames(x), _decode_frames(y)
        assert len(fx) == len(fy)
        return max(int(np.abs(u.astype(np.int16) - v.astype(np.int16)).max()) for u, v in zip(fx, fy))

    same = {str(p): gap(a / p, b / p) for p in files}
    assert max(same.values()) <= 8, same
    assert max(gap(a / p, c / p) for p in files) > 60  # another seed: other backgrounds and squares


def test_avqa_deterministic(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synth.write_avqa_sample(a, n_valid=6, n_train=6, seed=5)
    synth.write_avqa_sample(b, n_valid=6, n_train=6, seed=5)
    synth.write_avqa_sample(c, n_valid=6, n_train=6, seed=6)
    for split in ("valid", "train"):
        name = f"{split}/omni_rl_format_{split}.json"
        assert (a / name).read_text() == (b / name).read_text()
    assert (a / "train/omni_rl_format_train.json").read_text() != (
        c / "train/omni_rl_format_train.json"
    ).read_text()
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in files)


def test_shuffled_options_variant(tmp_path: Path) -> None:
    """The default sample keeps one option order per question type; shuffle_options=True varies it per row."""
    synth.write_nextqa_sample(tmp_path / "fixed", n_val=6, n_train=2)
    synth.write_nextqa_sample(tmp_path / "shuffled", n_val=12, n_train=2, shuffle_options=True)
    fixed = {tuple(r[f"a{k}"] for k in range(5)) for r in _read_csv(tmp_path / "fixed" / "val.csv") if r["type"] == "TN"}
    shuffled = {tuple(r[f"a{k}"] for k in range(5)) for r in _read_csv(tmp_path / "shuffled" / "val.csv") if r["type"] == "TN"}
    assert len(fixed) == 1 and len(shuffled) > 1
