"""Generic JSON-lines layout for multiple-choice questions::

    {"id": "q1", "question": "...", "options": ["...", "..."], "answer": "B" | 1,
     "video": "clips/1.mp4", "image": "...", "audio": "..."}

``answer`` is a letter or a 0-based index; media paths are relative to the file's folder unless absolute.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from relax_gym.envs.datasets.base import DatasetError, McqSample, read_utf8, resolve_media
from relax_gym.envs.rewards import LETTERS


class JsonlRecord(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | int | None = None
    question: str
    options: list[str]
    answer: str | int
    video: str | None = None
    image: str | None = None
    audio: str | None = None


def load_jsonl(path: Path) -> list[McqSample]:
    path = Path(path)
    samples = []
    for line_no, line in enumerate(read_utf8(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = JsonlRecord.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=line_no) from exc
        except ValidationError as exc:
            err = exc.errors()[0]
            raise DatasetError(path, err["msg"], line=line_no, field=".".join(map(str, err["loc"])) or None) from None
        n = len(rec.options)
        if not 2 <= n <= len(LETTERS):
            raise DatasetError(path, f"needs 2..{len(LETTERS)} options, got {n}", line=line_no, field="options")
        if isinstance(rec.answer, int):
            index = rec.answer
        else:
            letter = rec.answer.strip().upper()
            index = LETTERS.index(letter) if len(letter) == 1 and letter in LETTERS else -1
        if not 0 <= index < n:
            raise DatasetError(path, f"answer {rec.answer!r} does not name one of the {n} options", line=line_no, field="answer")
        media = {}
        for kind in ("video", "image", "audio"):
            value = getattr(rec, kind)
            if value is not None:
                file = resolve_media(path.parent, value)
                if not file.is_file():
                    raise DatasetError(path, f"{kind} file not found: {file}", line=line_no, field=kind)
                media[kind] = file
        samples.append(McqSample(
            uid=str(rec.id if rec.id is not None else line_no), question=rec.question, options=tuple(rec.options),
            answer_index=index, media=media, origin=f"{path.name} line {line_no}",
        ))
    if not samples:
        raise DatasetError(path, "no records")
    return samples
