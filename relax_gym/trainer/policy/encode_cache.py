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
    def __init__(self, maxsize: int = 512) -> None:
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        self.maxsize = maxsize
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
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
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict[str, Any]:
        return {"maxsize": self.maxsize}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["maxsize"])
