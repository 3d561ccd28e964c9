"""Dataset loaders on the real layouts, and every bad input giving one error that names file, row and field."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from relax_gym.envs.datasets import DatasetError, load_jsonl, load_nextqa, load_r1json, nextqa_from_dir, r1json_from_dir
from relax_gym.envs.datasets.nextqa import COLUMNS
from relax_gym.envs.synth import write_moving_square_video

ROW = {"video": "123", "frame_count": "16", "width": "64", "height": "64", "question": "which way", "answer": "1",
       "qid": "7", "type": "TN", "a0": "left", "a1": "right", "a2": "up", "a3": "down", "a4": "still"}


def write_csv(path: Path, rows: list[dict], columns=COLUMNS) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    write_moving_square_video(path, "right")
    return path


def flat_layout(tmp_path: Path, clip: Path, rows: list[dict]) -> Path:
    (tmp_path / "videos").mkdir(exist_ok=True)
    for r in rows:
        shutil.copy(clip, tmp_path / "videos" / f"{r['video']}.mp4")
    write_csv(tmp_path / "val.csv", rows)
    return tmp_path


# ---------------------------------------------------------------------------------------------- NExT-QA


def test_real_nextqa_rows_with_map_file(tmp_path, clip, nextqa_head_csv):
    """The real val rows (quoted fields, real ids) with videos placed through map_vid_vidorID.json."""
    rows = list(csv.DictReader(nextqa_head_csv.open(newline="")))
    mapping = {r["video"]: f"{1000 + i}/{r['video']}" for i, r in enumerate(rows)}
    for vid, rel in mapping.items():
        (tmp_path / "NExTVideo" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(clip, tmp_path / "NExTVideo" / f"{rel}.mp4")
    (tmp_path / "nextqa").mkdir()
    shutil.copy(nextqa_head_csv, tmp_path / "nextqa" / "val.csv")
    (tmp_path / "map_vid_vidorID.json").write_text(json.dumps(mapping))
    samples = nextqa_from_dir(tmp_path, "val")
    assert len(samples) == len(rows)
    first = samples[0]
    assert first.question == rows[0]["question"] and first.options[0] == rows[0]["a0"]
    assert first.answer_index == int(rows[0]["answer"]) and first.meta["type"] == rows[0]["type"]
    assert first.media["video"] == tmp_path / "NExTVideo" / f"{mapping[rows[0]['video']]}.mp4"
    assert first.origin == "val.csv row 1"


def test_quoted_question_with_commas(tmp_path, clip):
    row = dict(ROW, question='why, after the "jump", does it stop, then go?', a2="up, then down")
    samples = load_nextqa(flat_layout(tmp_path, clip, [row]) / "val.csv", tmp_path / "videos")
    assert samples[0].question == 'why, after the "jump", does it stop, then go?'
    assert samples[0].options[2] == "up, then down"


def test_missing_video_names_row_and_field(tmp_path, clip):
    flat_layout(tmp_path, clip, [ROW])
    write_csv(tmp_path / "val.csv", [ROW, dict(ROW, video="999", qid="8")])
    with pytest.raises(DatasetError) as err:
        load_nextqa(tmp_path / "val.csv", tmp_path / "videos")
    msg = str(err.value)
    assert "val.csv row 2 field 'video'" in msg and "999.mp4" in msg
    assert len(load_nextqa(tmp_path / "val.csv", tmp_path / "videos", on_missing="skip")) == 1


def test_missing_column(tmp_path):
    write_csv(tmp_path / "val.csv", [ROW], columns=[c for c in COLUMNS if c != "answer"])
    with pytest.raises(DatasetError, match=r"val.csv: missing column\(s\) answer \(header has: video,"):
        load_nextqa(tmp_path / "val.csv", tmp_path)


@pytest.mark.parametrize("answer, reason", [("7", "answer index 7 is out of range 0..4"), ("-1", "out of range"), ("B", "expected an integer")])
def test_bad_answer_index(tmp_path, clip, answer, reason):
    flat_layout(tmp_path, clip, [ROW, dict(ROW, answer=answer)])
    with pytest.raises(DatasetError, match=rf"val.csv row 2 field 'answer': .*{reason}"):
        load_nextqa(tmp_path / "val.csv", tmp_path / "videos")


def test_invalid_utf8_names_the_line(tmp_path, clip):
    flat_layout(tmp_path, clip, [ROW, ROW])
    data = (tmp_path / "val.csv").read_bytes().replace(b"which way", b"which \xff way", 2)
    (tmp_path / "val.csv").write_bytes(data)
    with pytest.raises(DatasetError, match=r"val.csv line 2: invalid UTF-8 \(byte 0xff at column \d+\)"):
        load_nextqa(tmp_path / "val.csv", tmp_path / "videos")


def test_short_and_long_rows(tmp_path, clip):
    flat_layout(tmp_path, clip, [ROW])
    header = ",".join(COLUMNS)
    (tmp_path / "val.csv").write_text(header + "\n123,16,64,64,q,1,7,TN,a,b,c\n")
    with pytest.raises(DatasetError, match="row 1 field 'a3': row is short"):
        load_nextqa(tmp_path / "val.csv", tmp_path / "videos")
    (tmp_path / "val.csv").write_text(header + "\n123,16,64,64,q,1,7,TN,a,b,c,d,e,extra\n")
    with pytest.raises(DatasetError, match="row 1: has 14 cells, the header has 13"):
        load_nextqa(tmp_path / "val.csv", tmp_path / "videos")


def test_empty_csv_and_missing_split(tmp_path):
    (tmp_path / "val.csv").write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(DatasetError, match="no usable rows"):
        load_nextqa(tmp_path / "val.csv", tmp_path)
    with pytest.raises(DatasetError, match="no test.csv found"):
        nextqa_from_dir(tmp_path, "test")


def test_bad_map_file(tmp_path, clip):
    flat_layout(tmp_path, clip, [ROW])
    (tmp_path / "map_vid_vidorID.json").write_text('{"123": "0000/123",\n oops}')
    with pytest.raises(DatasetError, match=r"map_vid_vidorID.json line 2: invalid JSON"):
        nextqa_from_dir(tmp_path, "val")


# ---------------------------------------------------------------------------------------------- R1-json


@pytest.fixture
def r1_dir(tmp_path, clip) -> Path:
    split = tmp_path / "valid"
    (split / "images").mkdir(parents=True)
    (split / "audios").mkdir()
    (split / "images" / "a.jpg").write_bytes(b"jpeg")
    (split / "audios" / "a.wav").write_bytes(b"wav")
    return tmp_path


def r1_item(**over):
    item = {"problem_id": 3, "problem": "How many beeps?", "data_type": "image_audio", "problem_type": "multiple choice",
            "options": ["A. one", "B. two", "C. three", "D. four"], "solution": "<answer>C</answer>",
            "path": {"image": "images/a.jpg", "audio": "audios/a.wav"}}
    item.update(over)
    return item


def write_r1(r1_dir: Path, items) -> Path:
    path = r1_dir / "valid" / "omni_rl_format_valid.json"
    path.write_text(json.dumps(items, indent=1))
    return path


def test_r1json_both_option_styles(r1_dir):
    write_r1(r1_dir, [r1_item(), r1_item(problem_id=4, options=[{"label": l, "text": t} for l, t in zip("ABCD", ["w", "x", "y", "z"])], solution="<answer>B</answer>")])
    a, b = r1json_from_dir(r1_dir, "val")  # "val" finds the AVQA "valid" split
    assert a.options == ("one", "two", "three", "four") and a.answer_letter == "C"
    assert a.media == {"image": r1_dir / "valid/images/a.jpg", "audio": r1_dir / "valid/audios/a.wav"}
    assert b.options == ("w", "x", "y", "z") and b.answer_index == 1 and b.uid == "4"


def test_video_r1_single_path(tmp_path, clip):
    shutil.copy(clip, tmp_path / "v.mp4")
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(r1_item(data_type="video", path="v.mp4")) + "\n")
    (s,) = load_r1json(path)
    assert s.media == {"video": tmp_path / "v.mp4"} and s.origin == "train.jsonl line 1"


@pytest.mark.parametrize(
    "over, where, reason",
    [
        ({"solution": "C"}, "field 'solution'", "expected '<answer>X</answer>'"),
        ({"solution": "<answer>F</answer>"}, "field 'solution'", "not one of ABCD"),
        ({"path": {"image": "images/missing.jpg", "audio": "audios/a.wav"}}, "field 'path.image'", "image file not found"),
        ({"path": {"image": "images/a.jpg"}}, "field 'path'", "needs image, audio"),
        ({"problem": None}, "field 'problem'", "valid string"),
        ({"options": ["A. only"]}, "field 'options'", "needs 2..26 options"),
        ({"problem_type": "free-form"}, "field 'problem_type'", "not multiple choice"),
        ({"path": {"smell": "x"}}, "field 'path'", "unknown media kind 'smell'"),
    ],
)
def test_r1json_bad_records(r1_dir, over, where, reason):
    path = write_r1(r1_dir, [r1_item(), r1_item(**over)])
    with pytest.raises(DatasetError) as err:
        load_r1json(path)
    assert f"omni_rl_format_valid.json row 1 {where}" in str(err.value) and reason in str(err.value)


def test_r1json_invalid_json_names_line(r1_dir):
    path = r1_dir / "valid" / "omni_rl_format_valid.json"
    path.write_text('[\n {"problem": "x",\n  "options": [}\n]')
    with pytest.raises(DatasetError, match=r"omni_rl_format_valid.json line 3: invalid JSON"):
        load_r1json(path)


# ---------------------------------------------------------------------------------------------- jsonl


def test_jsonl(tmp_path, clip):
    shutil.copy(clip, tmp_path / "c.mp4")
    path = tmp_path / "val.jsonl"
    lines = [{"id": "q1", "question": "dir?", "options": ["l", "r"], "answer": "B", "video": "c.mp4"},
             {"question": "n?", "options": ["1", "2", "3"], "answer": 0}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    a, b = load_jsonl(path)
    assert a.answer_index == 1 and a.media["video"] == tmp_path / "c.mp4" and b.uid == "2" and b.media == {}
    path.write_text(json.dumps(lines[1]) + "\n" + json.dumps({**lines[1], "answer": "D"}) + "\n")
    with pytest.raises(DatasetError, match="val.jsonl line 2 field 'answer': answer 'D' does not name one of the 3 options"):
        load_jsonl(path)
    path.write_text('{"question": "q", "options": ["a", "b"]}\n')
    with pytest.raises(DatasetError, match="val.jsonl line 1 field 'answer': Field required"):
        load_jsonl(path)
