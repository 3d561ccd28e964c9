"""A small pool of decoding threads, shared by the envs of a process, and prefetching into the decode cache.

Two uses. An async caller (an env worker running many episodes on one event loop) awaits :func:`decode_async`
instead of decoding inline, so a slow clip holds one pool thread while the other episodes go on; PyAV, Pillow and
soundfile release the GIL while they decode, so the threads really run in parallel. And a trainer or an env that
knows which records come next calls :meth:`DecodePool.prefetch` with their media parts: they are decoded in the
background into the decode cache (:mod:`relax_gym.omni.cache`) while the current step runs, and the reset that
needs one finds it there, or waits for the decode already under way rather than starting a second one.

The pool never changes what a decode gives: a part decodes through its own ``decode(cache)``, the same call a
synchronous reset makes, so gym users keep a synchronous API and see the same arrays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from relax_gym.omni.cache import DecodeCache, default_cache
from relax_gym.omni.errors import MediaError

log = logging.getLogger(__name__)

__all__ = ["DecodePool", "decode_async", "shared_pool"]


def _default_workers() -> int:
    return max(2, min(4, os.cpu_count() or 2))


class DecodePool:
    """``workers`` decoding threads (default: the cores, between 2 and 4) feeding ``cache``. Threads start on the
    first submission; ``close()`` stops them after the decodes under way."""

    def __init__(self, workers: int | None = None, cache: DecodeCache | None = default_cache) -> None:
        self.workers = workers or _default_workers()
        if self.workers < 1:
            raise ValueError(f"a decode pool needs at least one worker, got {self.workers}")
        self.cache = cache
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="decode")
        self._inflight: dict[tuple[str, str], Future] = {}
        self._lock = threading.Lock()

    def submit(self, part: Any) -> Future:
        """Decode ``part`` (an image, video or audio part) in a pool thread, through the cache; the future holds
        the decoded value or the :class:`MediaError`. A part already being decoded by this pool shares that
        future."""
        key = _key(part)
        with self._lock:
            running = self._inflight.get(key)
            if running is not None:
                return running
            future = self._executor.submit(part.decode, self.cache)
            self._inflight[key] = future
        future.add_done_callback(lambda _f, key=key: self._forget(key))
        return future

    async def decode(self, part: Any) -> Any:
        """Await ``part``'s decode without blocking the event loop (a slow clip holds one pool thread, not the
        loop)."""
        return await asyncio.wrap_future(self.submit(part))

    def prefetch(self, parts: Iterable[Any]) -> list[Future]:
        """Start decoding every part that is not in the cache yet; returns their futures. Failures are left in the
        futures (the reset that needs the part decodes it again and raises there, in its own episode)."""
        futures = []
        for part in parts:
            if self.cache is not None and self.cache.has(part.content_hash, part.sampling.cache_key()):
                continue
            future = self.submit(part)
            future.add_done_callback(_log_failure)
            futures.append(future)
        return futures

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._inflight.pop(key, None)


def _key(part: Any) -> tuple[str, str]:
    return part.content_hash, part.sampling.cache_key()


def _log_failure(future: Future) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if isinstance(exc, MediaError):
        log.debug("prefetch: %s", exc)
    elif exc is not None:
        log.warning("prefetch failed: %s: %s", type(exc).__name__, exc)


_shared: DecodePool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> DecodePool:
    """The process's pool on the default cache, made on first use (the envs of one env worker share it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = DecodePool()
        return _shared


async def decode_async(part: Any, pool: DecodePool | None = None) -> Any:
    """``await decode_async(part)``: ``part.decode()`` on ``pool`` (the shared one by default)."""
    return await (pool or shared_pool()).decode(part)
