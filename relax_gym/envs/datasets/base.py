"""Shared pieces of dataset loaders: the multiple-choice sample record and errors that name the culprit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DatasetError(ValueError):
    """A dataset file is malformed. The message starts with ``file[ row/line N][ field 'x']:``."""

    def __init__(self, file: Path | str, reason: str, *, row: int | None = None, line: int | None = None, field: str | None = None) -> None:
        self.file, self.row, self.line, self.field, self.reason = str(file), row, line, field, reason
        where = self.file
        if row is not None:
            where += f" row {row}"
        if line is not None:
            where += f" line {line}"
        if field is not None:
            where += f" field {field!r}"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class McqSample:
    """One multiple-choice question about some media.

    ``media`` maps a kind (``video``, ``image``, ``audio``) to a file; ``origin`` says where the record came
    from (``val.csv row 12``) for error messages; ``meta`` keeps the layout's other columns.
    """

    uid: str
    question: str
    options: tuple[str, ...]
    answer_index: int
    media: dict[str, Path]
    origin: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def answer_letter(self) -> str:
        return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[self.answer_index]


def read_utf8(path: Path) -> str:
    """Read a text file strictly as UTF-8 (a BOM is allowed); invalid bytes → DatasetError with the line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DatasetError(path, "file not found") from exc
    except OSError as exc:
        raise DatasetError(path, f"cannot read: {exc}") from exc
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DatasetError(path, f"invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {column})", line=line) from exc


def is_file(path: Path) -> bool:
    """``path.is_file()``, except that a path the OS refuses to look up (a name over its length limit) is simply
    not a file, instead of an ``OSError``."""
    try:
        return path.is_file()
    except OSError:
        return False


def json_problem(exc: ValueError | RecursionError) -> str:
    """Why ``json.loads`` refused a text that is not a syntax error: nesting beyond the interpreter's stack, or an
    integer longer than Python converts."""
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(":")[0]


def resolve_media(base: Path, value: str) -> Path:
    """A media path from a dataset record: absolute as is, relative to the record file's folder otherwise."""
    p = Path(value)
    return p if p.is_absolute() else base / p
