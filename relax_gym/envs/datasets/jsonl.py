"""Generic JSON-lines layout for multiple-choice questions::

    {"id": "q1", "question": "...", "options": ["...", "..."], "answer": "B" | 1,
     "video": "clips/1.mp4", "image": "...", "audio": "..."}

``answer`` is a letter or a 0-based index; media paths are relative to the file's folder unless absolute.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from relax_gym.envs.datasets.base import DatasetError, McqSample, is_file, json_problem, read_utf8, resolve_media
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
    # lines end at "\n" only: str.splitlines would also split at U+2028, U+0085, ... inside JSON strings
    for line_no, line in enumerate(read_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = JsonlRecord.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=line_no) from exc
        except ValidationError as exc:
            err = exc.errors()[0]
            raise DatasetError(path, err["msg"], line=line_no, field=".".join(map(str, err["loc"])) or None) from None
        except (ValueError, RecursionError) as exc:  # after ValidationError, which is a ValueError too
            raise DatasetError(path, f"invalid JSON: {json_problem(exc)}", line=line_no) from None
        if not rec.question.strip():
            raise DatasetError(path, "empty question", line=line_no, field="question")
        n = len(rec.options)
        if not 2 <= n <= len(LETTERS):
            raise DatasetError(path, f"needs 2..{len(LETTERS)} options, got {n}", line=line_no, field="options")
        empty = next((i for i, option in enumerate(rec.options) if not option.strip()), None)
        if empty is not None:
            raise DatasetError(path, "empty option", line=line_no, field=f"options.{empty}")
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
                if not is_file(file):
                    raise DatasetError(path, f"{kind} file not found: {file}", line=line_no, field=kind)
                media[kind] = file
        samples.append(McqSample(
            uid=str(rec.id if rec.id is not None else line_no), question=rec.question, options=tuple(rec.options),
            answer_index=index, media=media, origin=f"{path.name} line {line_no}",
        ))
    if not samples:
        raise DatasetError(path, "no records")
    return samples
