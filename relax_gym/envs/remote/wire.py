"""What goes over the wire between an env server and its clients: conversations, infos, errors.

Conversations use the OpenAI-style JSON of :mod:`relax_gym.omni.chat_json`, with the media of each part sent one of
two ways, chosen by the client per session:

- ``inline``: every media part is a base64 ``data:`` URL (files are read and sent as their bytes, arrays as
  ``.npy``). Works across hosts.
- ``ref``: files go as ``file://`` paths (nothing is copied); in-memory media (arrays, byte buffers) are written by
  the server to its spool folder and sent as ``file://`` paths with a ``relax_source`` note saying what they were,
  and the client loads them back as arrays or buffers when it decodes the response. Needs the client on the same
  host (the same files, readable by it).

Infos and reset options are JSON: tuples come back as lists, numpy scalars as numbers, numpy arrays as arrays (a
tagged ``.npy``), paths as strings, anything else as its ``repr``.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import mimetypes
from pathlib import Path
from typing import Any, Literal

import numpy as np

from relax_gym.omni import MediaSource, Message, from_openai, to_openai

PROTOCOL = 1
MediaMode = Literal["ref", "inline"]
MEDIA_MODES: tuple[str, ...] = ("ref", "inline")
_ARRAY_TAG = "__relax_ndarray__"


class WireError(ValueError):
    """A request or response does not have the expected shape; the message names the culprit field."""


# ---------------------------------------------------------------------------------------------- conversations


class Spool:
    """Where a server writes a session's in-memory media in ``ref`` mode: one folder per session, emptied when
    the session's next request arrives (the client has loaded the files by then) and removed with the session."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._n = 0

    def put(self, source: MediaSource) -> tuple[Path, dict[str, Any]]:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._n += 1
        if source.array is not None:
            path = self.folder / f"{self._n:06d}-{source.content_hash}.npy"
            path.write_bytes(source.npy_bytes())
            return path, {"kind": "array", "rate": source.rate}
        path = self.folder / f"{self._n:06d}-{source.content_hash}{mimetypes.guess_extension(source.mime or '') or '.bin'}"
        path.write_bytes(source.data)
        return path, {"kind": "data", "mime": source.mime}

    def clear(self) -> None:
        if self.folder.is_dir():
            for f in self.folder.iterdir():
                f.unlink(missing_ok=True)


def encode_messages(messages: list[Message], mode: MediaMode, spool: Spool | None = None) -> list[dict[str, Any]]:
    """Messages as JSON, media by reference (``ref``, needs ``spool`` for in-memory media) or inline."""
    notes: dict[tuple[int, int], dict[str, Any]] = {}
    converted = []
    for i, message in enumerate(messages):
        content = list(message.content)
        for k, part in enumerate(content):
            if part.kind == "text":
                continue
            src = part.source
            if mode == "inline" and src.path is not None:  # the file's bytes, as a data: URL
                content[k] = dataclasses.replace(part, source=MediaSource(data=src.path.read_bytes(), mime=src.guess_mime()))
            elif mode == "ref" and src.path is None:  # a spool file, as a file:// URL
                if spool is None:
                    raise ValueError("ref mode needs a spool folder for in-memory media")
                path, notes[i, k] = spool.put(src)
                content[k] = dataclasses.replace(part, source=MediaSource(path=path))
        converted.append(dataclasses.replace(message, content=tuple(content)))
    items = to_openai(converted)
    for (i, k), note in notes.items():
        items[i]["content"][k]["relax_source"] = note
    return items


def decode_messages(items: Any) -> list[Message]:
    """The inverse of :func:`encode_messages`: spooled media are read back (now) as the arrays or buffers they were."""
    messages = from_openai(items)
    out = []
    for message, item in zip(messages, items):
        content, changed = list(message.content), False
        raw = item["content"] if isinstance(item.get("content"), list) else []
        for k, obj in enumerate(raw):
            note = obj.get("relax_source") if isinstance(obj, dict) else None
            if not isinstance(note, dict):
                continue
            changed = True
            path = content[k].source.path
            if note.get("kind") == "array":
                source = MediaSource(array=np.load(path, allow_pickle=False), rate=note.get("rate"))
            else:
                source = MediaSource(data=path.read_bytes(), mime=note.get("mime"))
            content[k] = dataclasses.replace(content[k], source=source)
        out.append(dataclasses.replace(message, content=tuple(content)) if changed else message)
    return out


# ---------------------------------------------------------------------------------------------- infos


def encode_value(value: Any) -> Any:
    """A JSON-able copy of an info dict (or any value): see the module docstring for what changes on the way."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): encode_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [encode_value(v) for v in sorted(value, key=repr)]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return {_ARRAY_TAG: base64.b64encode(buf.getvalue()).decode()}
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_ARRAY_TAG}:
            return np.load(io.BytesIO(base64.b64decode(value[_ARRAY_TAG])), allow_pickle=False)
        return {k: decode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- errors


def error_body(kind: str, message: str, culprit: str, **extra: Any) -> dict[str, Any]:
    """``{"error": {"type", "message", "culprit", ...}}``: every failed request answers this."""
    return {"error": {"type": kind, "message": message, "culprit": culprit, **extra}}
