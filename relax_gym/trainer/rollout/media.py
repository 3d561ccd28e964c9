"""Media stored once per group: content keys for media tensors, references in their place, and their resolution.

Every sample of a GRPO group renders the same prompt, so every row of the group carries the same media tensors
(video frames, pixel values, audio features): with a group of 4-8, 4-8 copies of the heaviest data of the step.
Here a media tensor is named by its content (:func:`media_key`: blake2b over dtype, shape and bytes), so that

- the async mode puts each distinct tensor on the data bus once (:func:`split_media` turns the rows' ``mm_inputs``
  tensors into :class:`MediaRef` strings and returns the tensors by key, which the env worker hands to the bus's
  ``put(..., media=)``), and the actor, reference and critic put the tensors back (:class:`MediaResolver`, which
  reads missing keys with the bus's ``get_media`` and keeps a small cache of them per consumer);
- the colocate mode, which keeps its samples in memory, shares one tensor object among the trajectories that hold
  the same content (:func:`share_media`) instead of keeping a copy each.

A reference is a plain string (``"media:<hex>"``), not an object: it crosses any wire (TransferQueue's msgpack, Ray's
pickle) unchanged, and a key names exactly one dtype, shape and content, so a resolved tensor is bit-identical to
the one the env worker rendered. Tensors below :data:`MIN_SHARED_BYTES` (grid sizes, lengths) stay inline: a
reference and a lookup would cost more than they save. The bus itself knows nothing of this module: it stores
tensors under opaque keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import torch

from relax_gym.omni.cache import LRUCache

__all__ = ["MIN_SHARED_BYTES", "MediaRef", "MediaResolver", "is_media_ref", "media_key", "share_media",
           "split_media"]

MIN_SHARED_BYTES = 1024  # smaller media tensors stay inline in their row
REF_PREFIX = "media:"


class MediaRef(str):
    """A reference to a stored media tensor: ``"media:<content key>"``. A ``str`` so that it travels as one."""

    @property
    def key(self) -> str:
        return self[len(REF_PREFIX):]


def is_media_ref(value: Any) -> bool:
    """Whether an ``mm_inputs`` value is a reference (after a wire it is a plain ``str`` again)."""
    return isinstance(value, str) and value.startswith(REF_PREFIX)


def media_key(tensor: torch.Tensor) -> str:
    """The content key of a tensor: blake2b (128 bits) over its dtype, its shape and its bytes. Equal keys mean
    equal tensors bit for bit (the dtype and shape are part of the hash, so a reshaped or cast copy differs)."""
    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def _shared(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.numel() * tensor.element_size() >= MIN_SHARED_BYTES


def share_media(mms: Sequence[dict[str, torch.Tensor]]) -> int:
    """Make the media dicts ``mms`` share one tensor object per content (in place; the first holder's tensor is
    kept). The colocate trainer's dedupe: its samples stay in memory, so sharing is all a copy-free group needs.
    Returns the bytes no longer held twice."""
    first: dict[str, torch.Tensor] = {}
    saved = 0
    for mm in mms:
        for name, tensor in mm.items():
            if not _shared(tensor):
                continue
            key = media_key(tensor)
            kept = first.setdefault(key, tensor)
            if kept is not tensor:
                mm[name] = kept
                saved += tensor.numel() * tensor.element_size()
    return saved


def split_media(rows: Sequence[dict[str, Any]], field: str = "mm_inputs") -> tuple[list[dict[str, Any]],
                                                                                  dict[str, torch.Tensor], list[int]]:
    """Rows whose ``field`` media tensors are replaced by references, the tensors by key (one per content), and
    per row the bytes of the tensors it is the first to reference (what the store holds on its behalf). The input
    rows are not changed."""
    out: list[dict[str, Any]] = []
    media: dict[str, torch.Tensor] = {}
    stored: list[int] = []
    for row in rows:
        refs: dict[str, Any] = {}
        first = 0
        for name, tensor in (row.get(field) or {}).items():
            if not _shared(tensor):
                refs[name] = tensor
                continue
            key = media_key(tensor)
            if key not in media:
                media[key] = tensor
                first += tensor.numel() * tensor.element_size()
            refs[name] = MediaRef(REF_PREFIX + key)
        out.append({**row, field: refs} if field in row else dict(row))
        stored.append(first)
    return out, media, stored


GetMedia = Callable[[list[str]], Awaitable[Mapping[str, torch.Tensor]]]


class MediaResolver:
    """Puts stored media tensors back into fetched ``mm_inputs`` dicts: one consumer's reader with a small cache.

    ``max_bytes``: the cache's budget (LRU). A group's rows usually arrive in one micro-batch, so one read serves
    them all; the cache covers the rows of a group split over micro-batches (the reference and critic fetch rows,
    not groups) and a clip drawn again by a later step. Cached tensors are shared among the rows that reference
    them: consumers read media (collate copies them into the batch), they never edit them in place."""

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.cache = LRUCache(None, max_bytes=max_bytes, weigh=lambda t: t.numel() * t.element_size())
        self.reads = 0  # get_media calls
        self.read_bytes = 0  # bytes they returned

    async def resolve(self, mms: Sequence[Mapping[str, Any] | None], get: GetMedia) -> list[dict[str, Any]]:
        """``mms`` (one ``mm_inputs`` value per row, None for a row without media) with every reference replaced by
        its tensor. ``get(keys)``: reads tensors by key from the store (``lambda keys: bus.get_media(k, keys)``),
        called once for all the keys the cache does not hold, not at all when it holds them all."""
        wanted = {v[len(REF_PREFIX):] for mm in mms if mm for v in mm.values() if is_media_ref(v)}
        found = {k: self.cache.get(k, _unreachable) for k in wanted if k in self.cache}  # hits, no round trip
        missing = sorted(wanted - found.keys())
        if missing:
            got = await get(missing)
            lost = [k for k in missing if k not in got]
            if lost:
                raise KeyError(f"the media store has no tensor for key(s) {lost[:3]}")
            self.reads += 1
            for k in missing:
                tensor = got[k]
                self.read_bytes += tensor.numel() * tensor.element_size()
                found[k] = self.cache.get(k, lambda t=tensor: t)
        return [{name: (found[v[len(REF_PREFIX):]] if is_media_ref(v) else v) for name, v in (mm or {}).items()}
                for mm in mms]


def _unreachable() -> torch.Tensor:
    raise AssertionError("a cached media key vanished between the membership test and the read")
