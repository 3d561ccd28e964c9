"""NExT-QA multiple-choice layout (Xiao et al., CVPR 2021).

``{split}.csv`` with columns ``video,frame_count,width,height,question,answer,qid,type,a0..a4`` (``answer`` is
an index into a0..a4) and the VidOR clips as ``{video}.mp4``, either flat in a video folder or placed through
``map_vid_vidorID.json`` (``{"4010069381": "0000/4010069381", ...}``) as ``{folder}/{video}.mp4``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Literal

from relax_gym.envs.datasets.base import DatasetError, McqSample, is_file, json_problem, read_utf8

COLUMNS = ("video", "frame_count", "width", "height", "question", "answer", "qid", "type", "a0", "a1", "a2", "a3", "a4")
OPTION_COLUMNS = ("a0", "a1", "a2", "a3", "a4")
MAP_FILE = "map_vid_vidorID.json"
VIDEO_DIRS = ("videos", "NExTVideo", "video", ".")

OnMissing = Literal["error", "skip"]


def load_nextqa(csv_path: Path, video_root: Path, map_path: Path | None = None, *, on_missing: OnMissing = "error") -> list[McqSample]:
    csv_path = Path(csv_path)
    mapping = _load_map(map_path) if map_path is not None else {}
    reader = csv.DictReader(io.StringIO(read_utf8(csv_path), newline=""))
    try:
        return _load_rows(csv_path, reader, video_root, mapping, on_missing)
    except csv.Error as exc:  # e.g. a cell over the csv module's size limit
        raise DatasetError(csv_path, f"malformed CSV: {exc}", line=reader.line_num) from None


def _load_rows(csv_path: Path, reader: csv.DictReader, video_root: Path, mapping: dict[str, str],
               on_missing: OnMissing) -> list[McqSample]:
    header = tuple(reader.fieldnames or ())
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise DatasetError(csv_path, f"missing column(s) {', '.join(missing)} (header has: {', '.join(header) or 'nothing'})")
    samples: list[McqSample] = []
    for row_no, row in enumerate(reader, start=1):
        if None in row:  # more cells than header columns
            raise DatasetError(csv_path, f"has {len(header) + len(row[None])} cells, the header has {len(header)}", row=row_no)
        empty = [c for c in COLUMNS if row.get(c) is None]
        if empty:
            raise DatasetError(csv_path, "row is short: no value", row=row_no, field=empty[0])
        sample = _row_to_sample(csv_path, row_no, row, video_root, mapping, on_missing)
        if sample is not None:
            samples.append(sample)
    if not samples:
        raise DatasetError(csv_path, "no usable rows")
    return samples


def nextqa_from_dir(data_dir: Path, split: str, *, on_missing: OnMissing = "error") -> list[McqSample]:
    """Find ``{split}.csv``, the map file and the video folder under ``data_dir`` (the repository's
    ``dataset/nextqa`` folder or a flat folder) and load them."""
    data_dir = Path(data_dir)
    candidates = [data_dir / f"{split}.csv", data_dir / "nextqa" / f"{split}.csv", data_dir / "dataset" / "nextqa" / f"{split}.csv"]
    csv_path = next((c for c in candidates if c.is_file()), None)
    if csv_path is None:
        raise DatasetError(data_dir, f"no {split}.csv found (looked for {', '.join(str(c) for c in candidates)})")
    map_path = next((p for p in (csv_path.parent / MAP_FILE, data_dir / MAP_FILE) if p.is_file()), None)
    video_root = next((data_dir / d for d in VIDEO_DIRS if (data_dir / d).is_dir() and d != "."), data_dir)
    return load_nextqa(csv_path, video_root, map_path, on_missing=on_missing)


def _load_map(map_path: Path) -> dict[str, str]:
    try:
        mapping = json.loads(read_utf8(map_path))
    except json.JSONDecodeError as exc:
        raise DatasetError(map_path, f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    except (ValueError, RecursionError) as exc:
        raise DatasetError(map_path, f"invalid JSON: {json_problem(exc)}") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise DatasetError(map_path, 'must be a JSON object {"video id": "folder/video id"}')
    return {str(k): v for k, v in mapping.items()}


def _int_field(csv_path: Path, row_no: int, row: dict[str, str], name: str) -> int:
    value = row[name].strip()
    try:
        return int(value)
    except ValueError:
        raise DatasetError(csv_path, f"expected an integer, got {value!r}", row=row_no, field=name) from None


def _row_to_sample(csv_path: Path, row_no: int, row: dict[str, str], video_root: Path, mapping: dict[str, str], on_missing: OnMissing) -> McqSample | None:
    video_id = row["video"].strip()
    if not video_id:
        raise DatasetError(csv_path, "empty video id", row=row_no, field="video")
    answer = _int_field(csv_path, row_no, row, "answer")
    if not 0 <= answer < len(OPTION_COLUMNS):
        raise DatasetError(csv_path, f"answer index {answer} is out of range 0..{len(OPTION_COLUMNS) - 1}", row=row_no, field="answer")
    options = tuple(row[c].strip() for c in OPTION_COLUMNS)
    for col, text in zip(OPTION_COLUMNS, options):
        if not text:
            raise DatasetError(csv_path, "empty option", row=row_no, field=col)
    question = row["question"].strip()
    if not question:
        raise DatasetError(csv_path, "empty question", row=row_no, field="question")
    relative = mapping.get(video_id, video_id)
    video = video_root / f"{relative}.mp4"
    if not is_file(video):
        if on_missing == "skip":
            return None
        hint = "" if mapping else f" (no {MAP_FILE} was given; real NExT-QA clips sit in folders listed there)"
        raise DatasetError(csv_path, f"video file not found: {video}{hint}", row=row_no, field="video")
    meta = {k: row[k] for k in ("frame_count", "width", "height", "type")}
    return McqSample(
        uid=f"{video_id}-{row['qid'].strip()}",
        question=question,
        options=options,
        answer_index=answer,
        media={"video": video},
        origin=f"{csv_path.name} row {row_no}",
        meta=meta,
    )
