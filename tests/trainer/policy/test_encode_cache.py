"""The LRU caches (relax_gym/omni/cache.py) and the processor's encode cache: hits return the same encoding as a
fresh processor, keys follow content and the settings that change an encoding, failures are not cached, and a
copied processor starts empty."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from relax_gym.omni.cache import DecodeCache, LRUCache, array_key


def _same(a, b) -> None:
    assert a.kind == b.kind and list(a.token_ids) == list(b.token_ids)
    assert a.tensors.keys() == b.tensors.keys()
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k


def test_lru_evicts_the_least_recent_and_counts():
    cache = LRUCache(2)
    calls = []
    get = lambda k: cache.get(k, lambda: calls.append(k) or k * 10)  # noqa: E731
    assert [get(1), get(2), get(1), get(3), get(2)] == [10, 20, 10, 30, 20]
    assert calls == [1, 2, 3, 2]  # 2 was the least recent when 3 came in
    assert (cache.hits, cache.misses, len(cache)) == (1, 4, 2)


def test_a_byte_budget_evicts_by_size_and_skips_what_cannot_fit():
    cache = LRUCache(100, max_bytes=10, weigh=len)
    for key in ("a", "b", "c"):
        cache.get(key, lambda k=key: k * 4)  # 4 bytes each: the third pushes the first out
    assert (len(cache), cache.nbytes) == (2, 8)
    assert cache.get("a", lambda: "A" * 4) == "AAAA" and cache.misses == 4  # "a" was evicted
    assert cache.get("big", lambda: "x" * 11) == "x" * 11 and cache.nbytes <= 10 and "big" not in cache._items
    with pytest.raises(ValueError, match="weigh"):
        LRUCache(4, max_bytes=10).get("k", lambda: "v")
    media = DecodeCache(max_bytes=10)  # the decoded-media cache: the same LRU, weighed per call, no count limit
    for key in ("a", "b", "c"):
        media.get_or_decode(key, "spec", lambda k=key: k * 4, len)
    assert media.stats().entries == 2 and media.stats().evictions == 1 and ("c", "spec") in media
    assert len(pickle.loads(pickle.dumps(media))) == 0 and pickle.loads(pickle.dumps(media)).max_bytes == 10


def test_the_processor_bounds_its_media_cache_in_bytes(processor):
    assert processor.media_cache.max_bytes is not None
    enc = processor.encode_image(np.zeros((32, 32, 3), np.uint8))
    assert processor.media_cache.nbytes >= sum(t.numel() * t.element_size() for t in enc.tensors.values())
    restored = pickle.loads(pickle.dumps(processor))
    assert restored.media_cache.max_bytes == processor.media_cache.max_bytes and len(restored.media_cache) == 0


def test_a_failed_compute_is_not_cached():
    cache = LRUCache(4)

    def boom():
        raise ValueError("bad clip")

    for _ in range(2):
        with pytest.raises(ValueError, match="bad clip"):
            cache.get("k", boom)
    assert len(cache) == 0 and cache.misses == 2


def test_array_key_follows_content_shape_and_dtype():
    a = np.zeros((2, 3), np.uint8)
    assert array_key(a) == array_key(a.copy())
    b = a.copy()
    b[1, 2] = 1
    assert array_key(a) != array_key(b)
    assert array_key(a) != array_key(a.reshape(3, 2))
    assert array_key(a) != array_key(a.astype(np.int8))
    assert array_key(a, "video", 2.0) != array_key(a, "video", 4.0)


def test_video_hits_equal_a_fresh_encoding_and_settings_change_the_key(processor):
    rng = np.random.default_rng(0)
    clip = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    first = processor.encode_video(clip, fps=2.0)
    hits = processor.media_cache.hits
    again = processor.encode_video(clip.copy(), fps=2.0)  # equal content, another array: a hit
    assert processor.media_cache.hits == hits + 1
    fresh = copy.deepcopy(processor)
    assert len(fresh.media_cache) == 0  # a copy starts empty
    _same(again, fresh.encode_video(clip, fps=2.0))
    _same(first, again)
    slower = processor.encode_video(clip, fps=1.0)
    assert not torch.equal(slower.tensors["video_second_per_grid"], first.tensors["video_second_per_grid"])
    other = copy.copy(processor)
    other.video_max_pixels = 16 * 16
    assert len(other.encode_video(clip, fps=2.0).token_ids) < len(first.token_ids)


def test_text_hits_return_a_fresh_list(processor):
    ids = processor.encode_text("hello world")
    ids.append(-1)  # the caller's list is its own
    assert processor.encode_text("hello world") == ids[:-1]


def test_pickled_processor_drops_the_cache(processor):
    processor.encode_text("something to cache")
    restored = pickle.loads(pickle.dumps(processor))
    assert len(restored.text_cache) == 0
    assert restored.encode_text("something to cache") == processor.encode_text("something to cache")
