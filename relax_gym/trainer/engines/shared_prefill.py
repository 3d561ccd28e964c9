"""Shared prefill: identical prompts in one engine batch are prefilled once.

GRPO samples ``group_size`` completions of every prompt, so a rollout batch holds each prompt (its token ids and
its media) several times. Prefill — the vision / audio towers and the decoder over the whole prompt — is most of
a short completion's cost. SGLang avoids repeating it with its radix prefix cache; the embedded engine does the
same within a batch: it runs the model body once per distinct prompt over all tokens but the last, copies each
row of the KV cache to the batch rows that share it, and lets ``generate`` continue from that cache (it forwards
only the last prompt token, then decodes). Every row still samples on its own.

The result equals the unshared batch up to float rounding (a test checks tokens and log-probs). Models with
multimodal rope (Qwen2.5-Omni / Qwen2-VL: ``model.model.rope_deltas``) get their per-row position offsets copied the
same way. A batch is not shared when no prompt repeats, when a prompt is shorter than 2 tokens, or when a prompt
ends with a media placeholder (the last token is forwarded without its media).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SharePlan", "continue_kwargs", "plan_sharing", "prefill", "prompt_key", "same_media"]

PER_TOKEN = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")  # (B, L): cut with the prompt


@dataclass(frozen=True)
class SharePlan:
    unique: list[int]  # batch row index of each distinct prompt, in first-seen order
    index: torch.Tensor  # (B,) long: which distinct prompt each batch row is

    @property
    def saved_rows(self) -> int:
        return len(self.index) - len(self.unique)


def _bucket_key(input_ids: Sequence[int], mm: Mapping[str, torch.Tensor]) -> tuple:
    """A cheap key that equal prompts share: the ids, each media tensor's shape and dtype, and a digest of a
    strided sample of its values. Rows with equal keys are then compared in full (:func:`same_media`)."""
    media = []
    for name in sorted(mm):
        t = mm[name].detach().reshape(-1)
        sample = t[:: max(1, t.numel() // 64)].cpu().contiguous()
        digest = hashlib.blake2b(sample.view(torch.uint8).numpy().tobytes(), digest_size=8).digest() if sample.numel() else b""
        media.append((name, tuple(mm[name].shape), str(mm[name].dtype), digest))
    return (tuple(int(i) for i in input_ids), tuple(media))


def prompt_key(input_ids: Sequence[int], mm: Mapping[str, torch.Tensor]) -> tuple:
    """The cheap key equal prompts share (:func:`_bucket_key`): what the engine's prefill budget counts once."""
    return _bucket_key(input_ids, mm)


def same_media(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """The same media tensors, bit for bit (same names, shapes and values: ``torch.equal``)."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def plan_sharing(rows: Sequence[tuple[Sequence[int], Mapping[str, torch.Tensor]]], media_token_ids: set[int]) -> SharePlan | None:
    """Which rows (``(input_ids, mm)`` each) share a prompt — equal ids and bit-equal media; None when sharing
    would not save anything or is not safe for this batch."""
    if len(rows) < 2 or any(len(ids) < 2 or int(ids[-1]) in media_token_ids for ids, _ in rows):
        return None
    buckets: dict[tuple, list[int]] = {}  # key -> positions in ``unique`` of the distinct prompts with that key
    unique: list[int] = []
    index: list[int] = []
    for b, (ids, mm) in enumerate(rows):
        candidates = buckets.setdefault(_bucket_key(ids, mm), [])
        match = next((u for u in candidates if same_media(rows[unique[u]][1], mm)), None)
        if match is None:
            match = len(unique)
            unique.append(b)
            candidates.append(match)
        index.append(match)
    if len(unique) == len(rows):
        return None
    return SharePlan(unique=unique, index=torch.tensor(index, dtype=torch.long))


def prefill(model: Any, batch: Mapping[str, torch.Tensor], index: torch.Tensor) -> dict[str, Any]:
    """Prefill the distinct prompts of ``batch`` (left-padded, one row each) over all tokens but the last, spread
    the cache to the rows of ``index``, and return the keyword arguments that make ``model.generate`` continue
    from it for the full batch."""
    body = getattr(model, "model", None) or model
    inputs = {k: (v[:, :-1] if k in PER_TOKEN else v) for k, v in batch.items()}
    out = body(**inputs, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:
        raise RuntimeError(f"{type(body).__name__} returned no KV cache from its prefill")
    cache.batch_select_indices(index.to(batch["input_ids"].device))
    deltas = getattr(body, "rope_deltas", None)
    if isinstance(deltas, torch.Tensor) and deltas.shape[0] == batch["input_ids"].shape[0]:
        body.rope_deltas = deltas[index.to(deltas.device)]
    return continue_kwargs(batch, index, cache)


def continue_kwargs(batch: Mapping[str, torch.Tensor], index: torch.Tensor, cache: Any) -> dict[str, Any]:
    """``generate`` inputs for the full batch: the distinct rows' ids and mask repeated by ``index``, the cache.
    Media tensors are left out: every media token is already in the cache."""
    idx = index.to(batch["input_ids"].device)
    return {**{k: v[idx] for k, v in batch.items() if k in PER_TOKEN}, "cache": cache}
