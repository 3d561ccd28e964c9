"""Where a media part's bytes live: a file path, an in-memory buffer, or a decoded array. Sources are lazy
(nothing is read until a hash or a decode is asked for) and identified by a content hash."""

from __future__ import annotations

import hashlib
import io
import mimetypes
import os
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from relax_gym.omni.errors import MediaError

_HASH_CHUNK = 1 << 20
_path_hashes: dict[tuple[str, int, int], str] = {}
_path_hash_lock = threading.Lock()


def hash_file(path: Path) -> str:
    """blake2b-128 of the file's bytes; memoised on (path, size, mtime) so re-hashing an unchanged file is free."""
    try:
        st = path.stat()
    except OSError as exc:
        raise MediaError(str(path), "file not found" if isinstance(exc, FileNotFoundError) else str(exc)) from exc
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _path_hash_lock:
        known = _path_hashes.get(key)
    if known is not None:
        return known
    digest = hashlib.blake2b(digest_size=16)
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise MediaError(str(path), f"cannot read: {exc}") from exc
    value = digest.hexdigest()
    with _path_hash_lock:
        _path_hashes[key] = value
    return value


@dataclass(frozen=True, eq=False)
class MediaSource:
    """Exactly one of ``path``, ``data`` or ``array`` is set. ``rate`` is the frame rate (video arrays) or
    sample rate (audio arrays); ``mime`` describes ``data`` buffers."""

    path: Path | None = None
    data: bytes | None = None
    array: np.ndarray | None = field(default=None, repr=False)
    rate: float | None = None
    mime: str | None = None

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.path, self.data, self.array))
        if given != 1:
            raise ValueError("a media source needs exactly one of path, data or array")
        if self.path is not None:
            object.__setattr__(self, "path", Path(os.path.abspath(self.path)))
        if self.rate is not None:  # 16000 and 16000.0 are the same source (and survive a JSON round trip)
            object.__setattr__(self, "rate", float(self.rate))

    @classmethod
    def of(cls, value: str | os.PathLike | bytes | np.ndarray | MediaSource, *, rate: float | None = None, mime: str | None = None) -> MediaSource:
        if isinstance(value, MediaSource):
            return value
        if isinstance(value, bytes | bytearray):
            return cls(data=bytes(value), mime=mime)
        if isinstance(value, np.ndarray):
            return cls(array=value, rate=rate)
        return cls(path=Path(value))

    @cached_property
    def content_hash(self) -> str:
        if self.path is not None:
            return hash_file(self.path)
        digest = hashlib.blake2b(digest_size=16)
        if self.data is not None:
            digest.update(self.data)
        else:
            arr = np.ascontiguousarray(self.array)
            digest.update(f"{arr.dtype.str}{arr.shape}{self.rate}".encode())
            digest.update(arr.tobytes())
        return digest.hexdigest()

    @property
    def name(self) -> str:
        """Human-readable label used in error messages."""
        if self.path is not None:
            return str(self.path)
        if self.data is not None:
            return f"<{len(self.data)} bytes {self.mime or ''}>".replace(" >", ">")
        return f"<array {self.array.dtype} {tuple(self.array.shape)}>"

    def guess_mime(self) -> str | None:
        if self.mime:
            return self.mime
        if self.path is not None:
            return mimetypes.guess_type(self.path.name)[0]
        return None

    def raw(self) -> Path | bytes:
        """The undecoded form handed to decoders (a path or a buffer)."""
        if self.array is not None:
            raise TypeError("array sources are already decoded")
        return self.path if self.path is not None else self.data

    def npy_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.save(buf, self.array, allow_pickle=False)
        return buf.getvalue()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MediaSource):
            return NotImplemented
        if self.path is not None or other.path is not None:
            return self.path == other.path
        return self.rate == other.rate and self.content_hash == other.content_hash

    def __hash__(self) -> int:
        return hash(self.path) if self.path is not None else hash(self.content_hash)
