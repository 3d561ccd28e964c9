"""R1-json layout: AVQA-R1-6K (EchoInk-R1) and Video-R1.

A JSON list (or JSON lines) of records::

    {"problem": "...", "options": ["A. ...", "B. ..."] | [{"label": "A", "text": "..."}],
     "solution": "<answer>B</answer>", "path": {"image": "...", "audio": "...", "video": "..."} | "...",
     "data_type": "image_audio", "problem_type": "multiple choice", "problem_id": 0}

Media paths are relative to the JSON file's folder unless absolute. In AVQA-R1 the files are
``{split}/omni_rl_format_{split}.json`` with ``images/`` and ``audios/`` beside them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from relax_gym.envs.datasets.base import DatasetError, McqSample, is_file, json_problem, read_utf8, resolve_media
from relax_gym.envs.rewards import LETTERS, extract_answer

MEDIA_KINDS = ("image", "audio", "video")
_LEADING_LETTER = re.compile(r"^\s*\(?([A-Z])\s*[.:)]\s*")
_DATA_TYPE_KINDS = {"image": ("image",), "video": ("video",), "audio": ("audio",), "image_audio": ("image", "audio"), "video_audio": ("video", "audio")}


class _Option(BaseModel):
    model_config = ConfigDict(extra="allow")
    label: str
    text: str


class R1Record(BaseModel):
    model_config = ConfigDict(extra="allow")
    problem: str
    options: list[str | _Option]
    solution: str
    path: dict[str, str] | str
    data_type: str
    problem_type: str = "multiple choice"
    problem_id: int | str | None = None

    @field_validator("problem")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("empty problem text")
        return v


def load_r1json(path: Path, *, base_dir: Path | None = None) -> list[McqSample]:
    path = Path(path)
    base = base_dir or path.parent
    records = _read_records(path)
    samples = []
    for index, (raw, line) in enumerate(records):
        where = {"row": index} if line is None else {"line": line}
        try:
            rec = R1Record.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise DatasetError(path, err["msg"], field=field, **where) from None
        if rec.problem_type.lower() not in ("multiple choice", "multiple_choice", "mcq"):
            raise DatasetError(path, f"problem_type {rec.problem_type!r} is not multiple choice", field="problem_type", **where)
        samples.append(_to_sample(path, base, rec, index, where))
    if not samples:
        raise DatasetError(path, "no records")
    return samples


def r1json_from_dir(data_dir: Path, split: str) -> list[McqSample]:
    data_dir = Path(data_dir)
    names = [split, "valid" if split == "val" else split, "val" if split == "valid" else split]
    candidates = []
    for name in dict.fromkeys(names):
        candidates += [data_dir / name / f"omni_rl_format_{name}.json", data_dir / f"omni_rl_format_{name}.json", data_dir / f"{name}.json", data_dir / f"{name}.jsonl"]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise DatasetError(data_dir, f"no R1-json file for split {split!r} (looked for {', '.join(str(c) for c in candidates)})")
    return load_r1json(found)


def _read_records(path: Path) -> list[tuple[Any, int | None]]:
    text = read_utf8(path)
    if path.suffix == ".jsonl":
        out = []
        # JSON lines end at "\n" only: str.splitlines would also split at U+2028, U+0085, ... inside strings
        for line_no, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    out.append((json.loads(line), line_no))
                except json.JSONDecodeError as exc:
                    raise DatasetError(path, f"invalid JSON: {exc.msg}", line=line_no) from exc
                except (ValueError, RecursionError) as exc:
                    raise DatasetError(path, f"invalid JSON: {json_problem(exc)}", line=line_no) from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from exc
    except (ValueError, RecursionError) as exc:
        raise DatasetError(path, f"invalid JSON: {json_problem(exc)}") from None
    if not isinstance(data, list):
        raise DatasetError(path, f"expected a JSON list of records, got {type(data).__name__}")
    return [(item, None) for item in data]


def _to_sample(path: Path, base: Path, rec: R1Record, index: int, where: dict[str, int]) -> McqSample:
    options = []
    for i, opt in enumerate(rec.options):
        text = opt.text if isinstance(opt, _Option) else _LEADING_LETTER.sub("", opt, count=1)
        if not text.strip():
            raise DatasetError(path, "empty option", field=f"options.{i}", **where)
        options.append(text.strip())
    if not 2 <= len(options) <= len(LETTERS):
        raise DatasetError(path, f"needs 2..{len(LETTERS)} options, got {len(options)}", field="options", **where)
    answer = extract_answer(rec.solution)
    if answer is None:
        raise DatasetError(path, f"expected '<answer>X</answer>', got {rec.solution[:60]!r}", field="solution", **where)
    letter = answer.strip().strip("()").upper()[:1]
    if letter not in LETTERS[: len(options)]:
        raise DatasetError(path, f"answer {answer!r} is not one of {LETTERS[:len(options)]}", field="solution", **where)
    kinds = _DATA_TYPE_KINDS.get(rec.data_type)
    paths = rec.path if isinstance(rec.path, dict) else {kinds[0] if kinds else rec.data_type: rec.path}
    unknown = [k for k in paths if k not in MEDIA_KINDS]
    if unknown:
        raise DatasetError(path, f"unknown media kind {unknown[0]!r} (known: {', '.join(MEDIA_KINDS)})", field="path", **where)
    media = {}
    for kind, rel in paths.items():
        file = resolve_media(base, rel)
        if not is_file(file):
            raise DatasetError(path, f"{kind} file not found: {file}", field=f"path.{kind}", **where)
        media[kind] = file
    if kinds is not None and set(kinds) - set(media):
        raise DatasetError(path, f"data_type {rec.data_type!r} needs {', '.join(kinds)}, path gives {', '.join(media) or 'none'}", field="path", **where)
    uid = str(rec.problem_id if rec.problem_id is not None else index)
    origin = f"{path.name} " + (f"line {where['line']}" if "line" in where else f"item {index}")
    meta = {"data_type": rec.data_type, **{k: v for k, v in (rec.model_extra or {}).items() if isinstance(v, str | int | float)}}
    return McqSample(uid=uid, question=rec.problem.strip(), options=tuple(options), answer_index=LETTERS.index(letter), media=media, origin=origin, meta=meta)
