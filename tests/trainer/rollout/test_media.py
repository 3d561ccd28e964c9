"""Media stored once per group (relax_gym/trainer/rollout/media.py): content keys, references, resolution."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relax_gym.trainer.rollout.media import (
    MIN_SHARED_BYTES,
    MediaRef,
    MediaResolver,
    is_media_ref,
    media_key,
    share_media,
    split_media,
)


def _video(seed: int = 0) -> torch.Tensor:
    return torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_media_key_names_dtype_shape_and_bytes():
    v = _video()
    assert media_key(v) == media_key(v.clone()) and len(media_key(v)) == 32
    assert media_key(v) != media_key(v.reshape(12, 8, 8))  # same bytes, another shape
    assert media_key(v) != media_key(v.to(torch.float64).to(torch.float32) + 1e-7)
    assert media_key(torch.zeros(4, dtype=torch.int32)) != media_key(torch.zeros(4, dtype=torch.float32))
    assert media_key(v[:, :, ::2]) == media_key(v[:, :, ::2].contiguous())  # a strided view hashes its values
    for t in (torch.ones(3, dtype=torch.bool), torch.ones(2, dtype=torch.bfloat16), torch.tensor(3.0), torch.empty(0)):
        assert len(media_key(t)) == 32


def test_split_media_stores_each_content_once_and_keeps_small_tensors_inline():
    grid = torch.tensor([[1, 2, 2]])  # 24 bytes: below MIN_SHARED_BYTES, stays in the row
    rows = [{"sample_id": f"s{i}", "mm_inputs": {"pixel_values_videos": _video(), "video_grid_thw": grid}}
            for i in range(4)]
    rows.append({"sample_id": "other", "mm_inputs": {"pixel_values_videos": _video(1), "video_grid_thw": grid}})
    rows.append({"sample_id": "text", "mm_inputs": {}})
    out, media, stored = split_media(rows)
    assert len(media) == 2 and all(torch.equal(media[media_key(t)], t) for t in (_video(), _video(1)))
    size = _video().numel() * 4
    assert stored == [size, 0, 0, 0, size, 0]
    for row in out[:5]:
        ref = row["mm_inputs"]["pixel_values_videos"]
        assert isinstance(ref, MediaRef) and is_media_ref(ref) and ref.key in media
        assert row["mm_inputs"]["video_grid_thw"] is grid
    assert out[5] == {"sample_id": "text", "mm_inputs": {}}
    assert torch.is_tensor(rows[0]["mm_inputs"]["pixel_values_videos"])  # the input rows are not changed
    assert grid.numel() * grid.element_size() < MIN_SHARED_BYTES


def test_share_media_shares_one_tensor_object():
    mms = [{"v": _video()} for _ in range(4)] + [{"v": _video(1)}]
    saved = share_media(mms)
    assert saved == 3 * _video().numel() * 4
    assert all(mm["v"] is mms[0]["v"] for mm in mms[1:4]) and mms[4]["v"] is not mms[0]["v"]


def test_resolver_reads_missing_keys_once_and_caches_them():
    store = {media_key(_video(i)): _video(i) for i in range(3)}
    reads: list[list[str]] = []

    async def get(keys):
        reads.append(list(keys))
        return {k: store[k].clone() for k in keys}  # a bus returns copies

    rows = [{"v": MediaRef("media:" + media_key(_video(i % 2))), "n": torch.tensor([i])} for i in range(4)]
    resolver = MediaResolver()

    async def main():
        first = await resolver.resolve(rows + [None, {}], get)
        assert len(reads) == 1 and sorted(reads[0]) == sorted(media_key(_video(i)) for i in range(2))
        for i, mm in enumerate(first[:4]):
            assert torch.equal(mm["v"], _video(i % 2)) and torch.equal(mm["n"], torch.tensor([i]))
        assert first[4:] == [{}, {}]
        again = await resolver.resolve([{"v": "media:" + media_key(_video(0))}], get)  # a plain str after a wire
        assert len(reads) == 1 and again[0]["v"] is first[0]["v"]  # a cache hit, no read
        await resolver.resolve([{"v": "media:" + media_key(_video(2))}], get)
        assert reads[-1] == [media_key(_video(2))] and resolver.reads == 2

        async def lose(keys):
            return {}

        with pytest.raises(KeyError, match="no tensor"):
            await MediaResolver().resolve([{"v": "media:" + media_key(_video(0))}], lose)

    asyncio.run(main())


def test_resolver_cache_is_bounded_in_bytes():
    resolver = MediaResolver(max_bytes=_video().numel() * 4)  # room for one video
    store = {media_key(_video(i)): _video(i) for i in range(2)}

    async def get(keys):
        return {k: store[k] for k in keys}

    async def main():
        for i in range(2):
            await resolver.resolve([{"v": "media:" + media_key(_video(i))}], get)
        assert len(resolver.cache) == 1 and resolver.cache.nbytes <= resolver.cache.max_bytes

    asyncio.run(main())
