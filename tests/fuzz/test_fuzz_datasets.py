"""Fuzzing the dataset loaders: NExT-QA CSV (+ its map file), R1-json (list and JSON lines) and generic jsonl.

Properties: a loader returns samples that satisfy the record invariants (answer in range, options non-empty, media
files that exist, an ``origin`` naming the file) or raises one :class:`DatasetError` whose message starts with the
file's path -- never a ``csv.Error``, ``RecursionError``, ``OSError`` or any other type. Records written by the
standard writers with arbitrary text load back unchanged.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relax_gym.envs.datasets import DatasetError, load_jsonl, load_nextqa, load_r1json
from relax_gym.envs.datasets.nextqa import COLUMNS, MAP_FILE
from relax_gym.envs.rewards import LETTERS

from .support import PARSE, TEXT_CHARS, deep_json_list, json_values, long_int, mutated, scratch

pytestmark = pytest.mark.timeout(120)

cell = st.one_of(st.text(TEXT_CHARS, max_size=20), st.sampled_from(["0", "4", "5", "-1", " 2 ", "", "\x00", '"', "a,b",
                                                                     "line\nbreak", "\r", "vid1", "vid2"]))
option_text = st.text(TEXT_CHARS, min_size=1, max_size=20).filter(lambda s: s.strip())


def check_samples(samples, file: Path) -> None:
    assert samples, "a loader returned no samples without raising"
    for s in samples:
        assert 0 <= s.answer_index < len(s.options)
        assert all(o.strip() for o in s.options)
        assert s.question.strip()
        assert s.origin.startswith(file.name)
        assert all(p.is_file() for p in s.media.values())


def check_error(exc: DatasetError, *files: Path) -> None:
    assert type(exc) is DatasetError, type(exc)
    assert any(str(exc).startswith(str(f)) for f in files), f"{exc} does not start with one of {files}"


def check_json_blame(exc: DatasetError, data: bytes) -> None:
    """A line that is valid JSON is never reported as invalid JSON (the record, not the syntax, is at fault)."""
    if exc.line is None or "invalid JSON" not in exc.reason:
        return
    try:
        line = data.decode("utf-8-sig").split("\n")[exc.line - 1]
        json.loads(line)
    except (ValueError, RecursionError, IndexError):
        return
    raise AssertionError(f"line {exc.line} is valid JSON but was reported as {exc.reason!r}")


def write_videos(root: Path) -> Path:
    videos = root / "videos"
    (videos / "0000").mkdir(parents=True)
    for vid in ("vid1", "vid2"):
        (videos / f"{vid}.mp4").write_bytes(b"\x00")
    (videos / "0000" / "vid3.mp4").write_bytes(b"\x00")
    return videos


# ---------------------------------------------------------------------------------------------- NExT-QA


@st.composite
def nextqa_csvs(draw: st.DrawFn) -> bytes:
    header = list(COLUMNS)
    if draw(st.integers(0, 4)) == 0:
        header = draw(st.permutations(header))[: draw(st.integers(0, len(header)))]
    if draw(st.booleans()):
        header = header + draw(st.lists(st.sampled_from(["extra", "a5", "video"]), max_size=2))
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        row = [draw(cell) for _ in header]
        if draw(st.integers(0, 5)) == 0:  # short or long rows
            row = row[: draw(st.integers(0, len(row)))] + draw(st.lists(cell, max_size=2))
        rows.append(row)
    out = _csv_text([header, *rows]).encode()
    if draw(st.integers(0, 3)) == 0:
        out = draw(mutated(out))
    return out


def _csv_text(rows) -> str:
    import io

    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


@PARSE
@given(raw=nextqa_csvs(), mapping=st.one_of(st.none(), json_values.map(lambda v: json.dumps(v).encode()),
                                            st.just(b'{"vid3": "0000/vid3"}'), st.binary(max_size=30)))
@example(raw=("video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4\n"
              "vid1,1,1,1," + "q" * 200_000 + ",0,1,TN,a,b,c,d,e\n").encode(), mapping=None)  # a cell over csv's limit
@example(raw=("video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4\n"
              "vid1,1,1,1,q,0,1,TN,a,b,c,d,e\n".replace("vid1", "v" * 300)).encode(), mapping=None)  # name too long
@example(raw=b"video,answer\n\"unterminated", mapping=None)
@example(raw=b"video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4\nvid1,1,1,1,q,0,1,TN,a,b,c,d,e\n",
         mapping=deep_json_list.encode())
@example(raw=b"video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4\nvid1,1,1,1,q," + long_int.encode()
         + b",1,TN,a,b,c,d,e\n", mapping=None)
def test_nextqa_csv_loads_or_names_file_and_row(raw: bytes, mapping: bytes | None) -> None:
    with scratch() as root:
        videos = write_videos(root)
        csv_path = root / "val.csv"
        csv_path.write_bytes(raw)
        map_path = None
        if mapping is not None:
            map_path = root / MAP_FILE
            map_path.write_bytes(mapping)
        try:
            samples = load_nextqa(csv_path, videos, map_path)
        except DatasetError as exc:
            check_error(exc, csv_path, *(p for p in [map_path] if p is not None))
            return
        check_samples(samples, csv_path)


@PARSE
@given(rows=st.lists(st.tuples(st.sampled_from(["vid1", "vid2"]), option_text, st.integers(0, 4),
                               st.lists(option_text, min_size=5, max_size=5)), min_size=1, max_size=5))
def test_nextqa_rows_written_by_csv_writer_load_back(rows) -> None:
    with scratch() as root:
        videos = write_videos(root)
        table = [list(COLUMNS)]
        for i, (vid, question, answer, options) in enumerate(rows):
            table.append([vid, "16", "64", "64", question, str(answer), str(i), "TN", *options])
        (root / "val.csv").write_text(_csv_text(table), encoding="utf-8", newline="")
        samples = load_nextqa(root / "val.csv", videos)
        assert [(s.question, s.answer_index, s.options) for s in samples] == [
            (q.strip(), a, tuple(o.strip() for o in opts)) for _, q, a, opts in rows]
        assert [s.origin for s in samples] == [f"val.csv row {i}" for i in range(1, len(rows) + 1)]


# ---------------------------------------------------------------------------------------------- R1-json and jsonl


def r1_record(draw: st.DrawFn) -> dict:
    """Mostly-valid R1 records with one or two fields replaced by arbitrary JSON."""
    n = draw(st.integers(2, 5))
    rec = {
        "problem": draw(option_text),
        "options": draw(st.one_of(
            st.just([f"{LETTERS[i]}. opt {i}" for i in range(n)]),
            st.just([{"label": LETTERS[i], "text": f"opt {i}"} for i in range(n)]))),
        "solution": f"<answer>{draw(st.sampled_from(LETTERS[:n] + 'Z'))}</answer>",
        "path": draw(st.sampled_from([{"image": "img.jpg", "audio": "a.wav"}, "clip.mp4", {"video": "missing.mp4"},
                                      {"smell": "x"}])),
        "data_type": draw(st.sampled_from(["image_audio", "video", "audio", "smell"])),
        "problem_type": draw(st.sampled_from(["multiple choice", "mcq", "free-form"])),
    }
    for key in draw(st.lists(st.sampled_from([*rec, "problem_id", "extra"]), max_size=2)):
        rec[key] = draw(json_values)
    return rec


@st.composite
def r1_files(draw: st.DrawFn) -> tuple[str, bytes]:
    records = [r1_record(draw) for _ in range(draw(st.integers(0, 3)))]
    suffix = draw(st.sampled_from([".json", ".jsonl"]))
    if suffix == ".json":
        body = json.dumps(records if draw(st.integers(0, 5)) else draw(json_values), ensure_ascii=draw(st.booleans()))
    else:
        body = "\n".join(json.dumps(r, ensure_ascii=draw(st.booleans())) for r in records)
    data = body.encode()
    if draw(st.integers(0, 3)) == 0:
        data = draw(mutated(data))
    return suffix, data


def write_media(root: Path) -> None:
    for name in ("img.jpg", "a.wav", "clip.mp4"):
        (root / name).write_bytes(b"\x00")


def check_json_records(loader, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` beside the media it may name and load it: samples that hold up, or one
    DatasetError naming the file that never blames valid JSON for invalid syntax."""
    with scratch() as root:
        write_media(root)
        path = root / name
        path.write_bytes(data)
        try:
            samples = loader(path)
        except DatasetError as exc:
            check_error(exc, path)
            check_json_blame(exc, data)
            return
        check_samples(samples, path)


@PARSE
@given(file=r1_files())
@example(file=(".json", deep_json_list.encode()))
@example(file=(".jsonl", b'{"problem": ' + long_int.encode() + b"}"))
@example(file=(".json", b'[{"problem": "q", "options": ["A. x", "B. y"], "solution": "<answer>A</answer>", '
                        b'"path": "' + b"p" * 300 + b'.mp4", "data_type": "video"}]'))
def test_r1json_loads_or_names_file(file: tuple[str, bytes]) -> None:
    suffix, data = file
    check_json_records(load_r1json, f"records{suffix}", data)


@st.composite
def jsonl_files(draw: st.DrawFn) -> bytes:
    lines = []
    for _ in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, 5))
        rec = {"id": draw(st.one_of(st.none(), st.integers(), option_text)), "question": draw(option_text),
               "options": [f"opt {i}" for i in range(n)],
               "answer": draw(st.one_of(st.integers(-1, 6), st.sampled_from(["A", "b", " C ", "AA", ""]))),
               draw(st.sampled_from(["video", "image", "audio"])): draw(st.sampled_from(["clip.mp4", "nope.mp4"]))}
        for key in draw(st.lists(st.sampled_from([*rec, "extra"]), max_size=2)):
            rec[key] = draw(json_values)
        lines.append(json.dumps(rec, ensure_ascii=draw(st.booleans())))
    data = "\n".join(lines).encode()
    if draw(st.integers(0, 3)) == 0:
        data = draw(mutated(data))
    return data


@PARSE
@given(data=jsonl_files())
@example(data=deep_json_list.encode())
@example(data=b'{"question": "q", "options": ["a", "b"], "answer": ' + long_int.encode() + b"}")
@example(data=b'{"question": "q", "options": ["a", "b"], "answer": 0, "video": "' + b"v" * 300 + b'"}')
@example(data=b'{"question": "q", "options": ["a", "b"], "answer": [0]}')  # valid JSON, invalid record
@example(data=b'{"question": "q", "options": ["a", " "], "answer": 0}')  # the other layouts refuse empty options
@example(data=b'{"question": " ", "options": ["a", "b"], "answer": 0}')
def test_jsonl_loads_or_names_file_and_line(data: bytes) -> None:
    check_json_records(load_jsonl, "val.jsonl", data)


@PARSE
@given(questions=st.lists(option_text, min_size=1, max_size=4), ascii_only=st.booleans())
@example(questions=["first\u2028second"], ascii_only=False)  # a line separator inside a JSON string
@example(questions=["a\x85b\x1cc"], ascii_only=False)
def test_jsonl_records_written_by_json_dumps_load_back(questions: list[str], ascii_only: bool) -> None:
    with scratch() as root:
        records = [{"id": i, "question": q, "options": ["x", "y"], "answer": "B"} for i, q in enumerate(questions)]
        for name, loader in (("val.jsonl", load_jsonl), ("r1.jsonl", None)):
            path = root / name
            if loader is None:
                write_media(root)
                rows = [{"problem": q, "options": ["A. x", "B. y"], "solution": "<answer>B</answer>",
                         "path": "clip.mp4", "data_type": "video", "problem_id": i} for i, q in enumerate(questions)]
                path.write_text("\n".join(json.dumps(r, ensure_ascii=ascii_only) for r in rows) + "\n", encoding="utf-8")
                samples = load_r1json(path)
                assert [s.question for s in samples] == [q.strip() for q in questions]
                assert [s.origin for s in samples] == [f"r1.jsonl line {i}" for i in range(1, len(questions) + 1)]
            else:
                path.write_text("\n".join(json.dumps(r, ensure_ascii=ascii_only) for r in records) + "\n", encoding="utf-8")
                samples = loader(path)
                assert [s.question for s in samples] == questions
                assert [s.origin for s in samples] == [f"val.jsonl line {i}" for i in range(1, len(questions) + 1)]
