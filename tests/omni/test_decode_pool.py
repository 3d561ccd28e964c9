"""The decode pool (relax_gym/omni/decode_pool.py): a slow decode holds one thread, not the others nor the event
loop; prefetch fills the decode cache; a decode under way is shared, never repeated."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

import relax_gym
from relax_gym.omni import DecodeCache, VideoPart, default_cache
from relax_gym.omni.decode_pool import DecodePool, decode_async


@dataclass(frozen=True)
class _Spec:
    key: str

    def cache_key(self) -> str:
        return self.key


@dataclass(eq=False)
class SlowPart:
    """A stand-in media part whose decode takes ``seconds`` (or waits on ``gate``) and counts its calls."""

    name: str
    seconds: float = 0.0
    gate: threading.Event | None = None
    calls: list[str] = field(default_factory=list)

    @property
    def content_hash(self) -> str:
        return self.name

    @property
    def sampling(self) -> _Spec:
        return _Spec("slow")

    def decode(self, cache: DecodeCache | None = None) -> np.ndarray:
        def run() -> np.ndarray:
            self.calls.append(threading.current_thread().name)
            if self.gate is not None:
                assert self.gate.wait(10), "gate never opened"
            time.sleep(self.seconds)
            return np.zeros(4, np.uint8)

        return run() if cache is None else cache.get_or_decode(self.content_hash, "slow", run, lambda a: a.nbytes)


def test_a_slow_decode_does_not_block_another():
    gate = threading.Event()
    pool = DecodePool(workers=2, cache=DecodeCache(1 << 20))
    try:
        slow = pool.submit(SlowPart("slow", gate=gate))
        fast = pool.submit(SlowPart("fast"))
        assert fast.result(timeout=5).shape == (4,)
        assert not slow.done()  # still stuck on its clip while the other finished
        gate.set()
        assert slow.result(timeout=5).shape == (4,)
    finally:
        gate.set()
        pool.close()


def test_awaiting_a_decode_leaves_the_event_loop_free():
    """While one decode is held (on a gate, not for a length of time) the loop awaits another to the end."""
    gate = threading.Event()
    pool = DecodePool(workers=2, cache=DecodeCache(1 << 20))

    async def main() -> None:
        slow = asyncio.ensure_future(decode_async(SlowPart("slow", gate=gate), pool))
        await asyncio.wait_for(pool.decode(SlowPart("fast")), 30)
        assert not slow.done()  # the fast one came back while the slow one still held its thread
        gate.set()
        assert (await asyncio.wait_for(slow, 30)).shape == (4,)

    try:
        asyncio.run(main())
    finally:
        gate.set()
        pool.close()


def test_prefetch_fills_the_cache(silent_clip):
    cache = DecodeCache(64 << 20)
    pool = DecodePool(workers=2, cache=cache)
    part = VideoPart.of(silent_clip, fps=4.0)
    try:
        futures = pool.prefetch([part, part])
        assert len(futures) >= 1
        for f in futures:
            f.result(timeout=30)
        assert cache.has(part.content_hash, part.sampling.cache_key())
        assert pool.prefetch([part]) == []  # cached: nothing to start
        before = cache.stats().hits
        part.decode(cache)
        assert cache.stats().hits == before + 1
    finally:
        pool.close()


def test_a_decode_under_way_is_shared_not_repeated():
    """A reset that asks for the clip a prefetch is decoding waits for that decode (one decode, two results)."""
    cache = DecodeCache(1 << 20)
    gate = threading.Event()
    part = SlowPart("shared", gate=gate)
    pool = DecodePool(workers=1, cache=cache)
    try:
        (prefetched,) = pool.prefetch([part])
        results = []
        reset = threading.Thread(target=lambda: results.append(part.decode(cache)))
        reset.start()
        time.sleep(0.1)
        gate.set()
        reset.join(5)
        assert prefetched.result(timeout=5) is results[0]
        assert len(part.calls) == 1
    finally:
        gate.set()
        pool.close()


def test_a_failed_decode_is_retried_by_the_next_caller():
    cache = DecodeCache(1 << 20)
    attempts = []

    def failing():
        attempts.append(1)
        raise ValueError("broken")

    with pytest.raises(ValueError):
        cache.get_or_decode("h", "s", failing, len)
    assert cache.get_or_decode("h", "s", lambda: b"ok", len) == b"ok"
    assert len(attempts) == 1


def test_env_prefetch_decodes_the_clips_of_the_next_seeds():
    env = relax_gym.make("nextqa-video")
    inner = env.unwrapped
    seeds = [11, 12, 13]
    default_cache.clear()
    for f in inner.prefetch(seeds):
        f.result(timeout=60)
    for seed in seeds:
        part = inner._media_parts(inner.samples[inner.record_for_seed(seed)])[0]
        assert default_cache.has(part.content_hash, part.sampling.cache_key())
        _, info = env.reset(seed=seed)
        assert info["sample_index"] == inner.record_for_seed(seed)
    env.close()
