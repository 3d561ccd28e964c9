"""A small thread-safe LRU cache for the processor's encodings.

GRPO renders every prompt ``group_size`` times (one episode per sample), and the chat template's fixed pieces
(system prompt, role headers) are tokenised again in every turn of every episode. Tokenising a string and
resizing / normalising / patchifying a clip are pure functions of their input, so the processor keeps the last
results: text by its value, media by a digest of the decoded array's bytes (plus shape, dtype and the sampling
rate or fps that changes the encoding). Cached tensors are shared between hits: callers treat encodings as
read-only (collation concatenates them into new tensors).

The cache is dropped when the processor is pickled or copied (a Ray role gets an empty one).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

__all__ = ["EncodeCache", "array_key"]

T = TypeVar("T")


def array_key(array: np.ndarray, *extra: Hashable) -> tuple:
    """A cache key for an array's content: blake2b of its bytes, with its shape and dtype (and ``extra``)."""
    a = np.ascontiguousarray(array)
    digest = hashlib.blake2b(a.data, digest_size=16).digest()
    return (digest, a.shape, a.dtype.str, *extra)


class EncodeCache:
    """At most ``maxsize`` entries and, with ``max_bytes``, at most that many bytes as ``weigh(value)`` counts them
    (a real model's video encodings are tens of MB each: an entry count alone does not bound the memory)."""

    def __init__(self, maxsize: int = 512, *, max_bytes: int | None = None,
                 weigh: Callable[[Any], int] | None = None) -> None:
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        if max_bytes is not None and (max_bytes < 0 or weigh is None):
            raise ValueError(f"max_bytes needs a weigh function and must be >= 0, got {max_bytes}")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._weigh = weigh
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self.nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The cached value for ``key``, computing (outside the lock) and storing it on a miss. A failed
        ``compute`` stores nothing, so a bad input raises every time."""
        if self.maxsize == 0:
            return compute()
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            self.misses += 1
        value = compute()
        size = int(self._weigh(value)) if self.max_bytes is not None else 0
        if self.max_bytes is not None and size > self.max_bytes:
            return value  # larger than the whole budget: not kept
        with self._lock:
            self.nbytes -= self._sizes.pop(key, 0)
            self._items[key] = value
            self._items.move_to_end(key)
            self._sizes[key] = size
            self.nbytes += size
            while len(self._items) > self.maxsize or (self.max_bytes is not None and self.nbytes > self.max_bytes):
                old, _ = self._items.popitem(last=False)
                self.nbytes -= self._sizes.pop(old, 0)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._sizes.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict[str, Any]:
        return {"maxsize": self.maxsize, "max_bytes": self.max_bytes, "weigh": self._weigh}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["maxsize"], max_bytes=state.get("max_bytes"), weigh=state.get("weigh"))
