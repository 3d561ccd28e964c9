"""An in-memory LRU cache of decoded media, keyed by content hash + sampling spec, bounded in bytes.

Cached arrays are read-only, so one decode can be shared by every episode that shows the same clip.
The budget defaults to 1 GiB and is set with ``RELAX_GYM_DECODE_CACHE_MB`` (0 disables caching).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


class DecodeCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._stats = CacheStats()

    def get_or_decode(self, content_hash: str, spec_key: str, decode: Callable[[], T], size: Callable[[T], int]) -> T:
        key = (content_hash, spec_key)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self._stats.hits += 1
                return hit[0]
            self._stats.misses += 1
        value = decode()  # outside the lock: decoding is slow and may run in parallel threads
        nbytes = size(value)
        with self._lock:
            if nbytes <= self.max_bytes and key not in self._items:
                self._items[key] = (value, nbytes)
                self._stats.bytes += nbytes
                while self._stats.bytes > self.max_bytes:
                    _, (_, dropped) = self._items.popitem(last=False)
                    self._stats.bytes -= dropped
                    self._stats.evictions += 1
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._stats.bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(**{**self._stats.__dict__, "entries": len(self._items)})


def _budget_from_env() -> int:
    raw = os.environ.get("RELAX_GYM_DECODE_CACHE_MB", "1024")
    try:
        megabytes = float(raw)
    except ValueError as exc:
        raise ValueError(f"RELAX_GYM_DECODE_CACHE_MB must be a number of megabytes, got {raw!r}") from exc
    return int(megabytes * 1024 * 1024)


default_cache = DecodeCache(_budget_from_env())
