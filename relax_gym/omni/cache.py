"""In-memory LRU caches for pure, costly functions of media and text.

:class:`LRUCache` keeps the last results of a computation by key, bounded by an entry count, a byte budget or
both; a failed computation stores nothing, and a pickled or copied cache arrives empty (a Ray role gets its own).
Cached values are shared between hits, so callers treat them as read-only. A key asked for while another thread
computes it waits for that result rather than computing it again (a prefetch and the reset that needs the same
clip decode it once; see :mod:`relax_gym.omni.decode_pool`).

Two users: the decoded-media cache here (:class:`DecodeCache`, keyed by content hash + sampling spec; its budget
defaults to 1 GiB and is set with ``RELAX_GYM_DECODE_CACHE_MB``, 0 disables it), and the trainer's processor,
which keeps recent text and media encodings (``relax_gym/trainer/policy/processor.py``, keys from
:func:`array_key`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = ["CacheStats", "DecodeCache", "LRUCache", "array_key", "default_cache"]

T = TypeVar("T")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


def array_key(array: np.ndarray, *extra: Hashable) -> tuple:
    """A cache key for an array's content: blake2b of its bytes, with its shape and dtype (and ``extra``)."""
    a = np.ascontiguousarray(array)
    digest = hashlib.blake2b(a.data, digest_size=16).digest()
    return (digest, a.shape, a.dtype.str, *extra)


class LRUCache:
    """At most ``maxsize`` entries (None: no count limit) and, with ``max_bytes``, at most that many bytes as
    ``weigh(value)`` counts them (a real model's video encodings are tens of MB each: a count alone does not bound
    the memory). A value larger than the whole byte budget is computed and returned but not kept."""

    def __init__(self, maxsize: int | None = 512, *, max_bytes: int | None = None,
                 weigh: Callable[[Any], int] | None = None) -> None:
        if maxsize is not None and maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._weigh = weigh
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._lock = threading.Lock()
        self._pending: dict[Hashable, threading.Event] = {}  # keys being computed right now
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: Hashable, compute: Callable[[], T], weigh: Callable[[T], int] | None = None) -> T:
        """The cached value for ``key``, computing it (outside the lock: it may be slow and run in parallel
        threads) and storing it on a miss. ``weigh`` overrides the cache's own for this value; a byte budget
        needs one of the two."""
        if self.maxsize == 0 or self.max_bytes == 0:
            return compute()
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    self.hits += 1
                    return self._items[key]
                pending = self._pending.get(key)
                if pending is None:  # this thread computes it; others asking meanwhile wait for it
                    self._pending[key] = threading.Event()
                    self.misses += 1
                    break
            # Another thread (a prefetch, a parallel reset of the same clip) is computing this value: wait for it
            # instead of decoding the same media twice; if it failed or was too large to keep, look again (and
            # compute it here).
            pending.wait()
        try:
            value = self._compute_and_store(key, compute, weigh)
        finally:
            with self._lock:
                done = self._pending.pop(key, None)
            if done is not None:
                done.set()
        return value

    def _compute_and_store(self, key: Hashable, compute: Callable[[], T], weigh: Callable[[T], int] | None) -> T:
        value = compute()
        size = 0
        if self.max_bytes is not None:
            weigh = weigh or self._weigh
            if weigh is None:
                raise ValueError("a cache with max_bytes needs a weigh function (the cache's or the call's)")
            size = int(weigh(value))
            if size > self.max_bytes:
                return value
        with self._lock:
            self.nbytes -= self._sizes.pop(key, 0)
            self._items[key] = value
            self._items.move_to_end(key)
            self._sizes[key] = size
            self.nbytes += size
            while (self.maxsize is not None and len(self._items) > self.maxsize) or (
                    self.max_bytes is not None and self.nbytes > self.max_bytes):
                old, _ = self._items.popitem(last=False)
                self.nbytes -= self._sizes.pop(old, 0)
                self.evictions += 1
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._sizes.clear()
            self.nbytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self.hits, misses=self.misses, evictions=self.evictions, bytes=self.nbytes,
                              entries=len(self._items))

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict[str, Any]:
        return {"maxsize": self.maxsize, "max_bytes": self.max_bytes, "weigh": self._weigh}

    def __setstate__(self, state: dict[str, Any]) -> None:
        LRUCache.__init__(self, state["maxsize"], max_bytes=state.get("max_bytes"), weigh=state.get("weigh"))


class DecodeCache(LRUCache):
    """Decoded media by (content hash, sampling spec), bounded in bytes only."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(None, max_bytes=max_bytes)

    def get_or_decode(self, content_hash: str, spec_key: str, decode: Callable[[], T], size: Callable[[T], int]) -> T:
        return self.get((content_hash, spec_key), decode, size)

    def has(self, content_hash: str, spec_key: str) -> bool:
        """Whether this decode is cached (a prefetch skips those)."""
        return (content_hash, spec_key) in self

    def __setstate__(self, state: dict[str, Any]) -> None:
        DecodeCache.__init__(self, state["max_bytes"])


def _budget_from_env() -> int:
    raw = os.environ.get("RELAX_GYM_DECODE_CACHE_MB", "1024")
    try:
        megabytes = float(raw)
    except ValueError as exc:
        raise ValueError(f"RELAX_GYM_DECODE_CACHE_MB must be a number of megabytes, got {raw!r}") from exc
    return int(megabytes * 1024 * 1024)


default_cache = DecodeCache(_budget_from_env())
