"""Routed experts as data: SGLang's wire format, per-episode alignment, batching and mismatch counts.

A routing record is an integer tensor ``(tokens, layers, k)``: for each token position of a sequence, the ``k``
experts every MoE layer sent that token to. It is stored as ``int16`` (:data:`ROUTING_DTYPE`); ``-1`` marks a
position with no record (a token that was never forwarded by the engine: the episode's last token, an env reply
appended after the last turn, right padding).

**Wire format** (SGLang's ``return_routed_experts``): the response's ``meta_info["routed_experts"]`` is base64 of
the flat row-major bytes of the ``(positions, layers, k)`` array and ``meta_info["routed_experts_dtype"]`` names
their dtype (``uint8`` / ``uint16`` / ``int32``; absent means ``int32``, SGLang's older servers). Positions are
the request's prompt tokens plus its generated tokens but the last (``prompt_tokens + completion_tokens - 1``):
the routing of every token the engine forwarded. :func:`encode_routed_experts` picks the smallest unsigned dtype
that holds the ids (``uint8`` below 256 experts), as SGLang does when asked to compress.

**Episodes** (:func:`merge_turn`): each turn's request re-sends the whole conversation, so its record covers every
earlier position again; the first record of a position is kept (what SGLang returns with its prefix cache: cached
tokens keep the routing computed when they were first forwarded) and the turn adds the positions after it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "ROUTING_DTYPE", "RoutingCounts", "batch_routing", "decode_routed_experts", "empty_routing", "encode_routed_experts",
    "merge_turn", "mismatch_counts",
]

ROUTING_DTYPE = torch.int16
_WIRE_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "int32": np.int32}


def encode_routed_experts(ids: torch.Tensor) -> tuple[str, str]:
    """``(base64 payload, dtype name)`` of a ``(positions, layers, k)`` id tensor, in SGLang's wire format."""
    array = ids.detach().cpu().numpy()
    name = "int32"
    if array.size == 0 or array.min() >= 0:
        top = int(array.max()) if array.size else 0
        name = "uint8" if top < 256 else "uint16" if top < 65536 else "int32"
    payload = np.ascontiguousarray(array.astype(_WIRE_DTYPES[name], copy=False)).tobytes()
    return base64.b64encode(payload).decode("ascii"), name


def decode_routed_experts(meta_info: Mapping[str, Any], layers: int, top_k: int) -> torch.Tensor:
    """``meta_info``'s ``routed_experts`` as an ``(positions, layers, top_k)`` int16 tensor (ValueError naming what
    is wrong for a payload that is not base64, has an unknown dtype or does not divide into that shape)."""
    payload = meta_info.get("routed_experts")
    if not isinstance(payload, str):
        raise ValueError("meta_info has no routed_experts string (was the request sent with return_routed_experts=true "
                         "to a server that records them: SGLang needs --enable-return-routed-experts)")
    name = meta_info.get("routed_experts_dtype") or "int32"
    if name not in _WIRE_DTYPES:
        raise ValueError(f"routed_experts_dtype {name!r} is not one of {sorted(_WIRE_DTYPES)}")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"routed_experts is not valid base64 ({exc})") from None
    width = np.dtype(_WIRE_DTYPES[name]).itemsize
    per_position = layers * top_k
    if len(raw) % (width * per_position):
        raise ValueError(f"routed_experts holds {len(raw)} bytes of {name}: not a whole number of positions of "
                         f"{layers} layers x top-{top_k}")
    flat = np.frombuffer(raw, dtype=_WIRE_DTYPES[name])
    return torch.from_numpy(flat.astype(np.int16)).view(-1, layers, top_k)


def empty_routing(layers: int, top_k: int) -> torch.Tensor:
    return torch.empty((0, layers, top_k), dtype=ROUTING_DTYPE)


def merge_turn(so_far: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """The episode's record after a turn: the positions known so far, then the turn's record of the positions after
    them (``turn`` covers the whole request, from position 0)."""
    if turn.shape[1:] != so_far.shape[1:]:
        raise ValueError(f"a turn's routing has shape {list(turn.shape)}, the episode's {list(so_far.shape)}")
    return torch.cat([so_far, turn[so_far.shape[0]:].to(ROUTING_DTYPE)])


def batch_routing(records: Sequence[torch.Tensor | None], width: int, layers: int, top_k: int) -> torch.Tensor:
    """Right-padded ``(B, width, layers, top_k)`` int16 of the rows' records (-1 where a row has none)."""
    out = torch.full((len(records), width, layers, top_k), -1, dtype=ROUTING_DTYPE)
    for b, rec in enumerate(records):
        if rec is None or rec.numel() == 0:
            continue
        if tuple(rec.shape[1:]) != (layers, top_k):
            raise ValueError(f"row {b}: routing of shape {list(rec.shape)} does not fit {layers} MoE layers x top-{top_k}")
        n = min(rec.shape[0], width)
        out[b, :n] = rec[:n]
    return out


class RoutingCounts:
    """Mismatch between a record and a training forward, accumulated over micro-batches, per MoE layer: the share of
    recorded (token, expert) choices the training forward did not make."""

    def __init__(self) -> None:
        self.mismatched: torch.Tensor | None = None  # per layer: against the router's own choice
        self.replayed_mismatched: torch.Tensor | None = None  # per layer: against the experts actually used
        self.slots = 0  # recorded (token, slot) pairs per layer
        self.forced_tokens = 0

    def add(self, recorded: torch.Tensor, natural: Sequence[torch.Tensor], used: Sequence[torch.Tensor],
            valid: torch.Tensor) -> None:
        """``recorded`` (B, T, L, K); ``natural`` / ``used``: per layer (B, T, K); ``valid`` (B, T) bool: positions
        with a record that count (real tokens). Counted on the CPU: a GPU forward's traces and mask meet the
        (CPU) record here."""
        recorded = recorded.cpu()
        has = valid.cpu() & (recorded >= 0).all(dim=-1).all(dim=-1)
        rec = recorded[has].long()  # (N, L, K)
        nat = torch.stack([n.cpu()[has] for n in natural], dim=1)
        use = torch.stack([u.cpu()[has] for u in used], dim=1)
        miss, miss_used = mismatch_counts(rec, nat), mismatch_counts(rec, use)
        self.mismatched = miss if self.mismatched is None else self.mismatched + miss
        self.replayed_mismatched = miss_used if self.replayed_mismatched is None else self.replayed_mismatched + miss_used
        self.slots += int(rec.shape[0] * rec.shape[-1])
        self.forced_tokens += int(rec.shape[0])

    def metrics(self) -> dict[str, float]:
        """``routing_mismatch`` (router's own top-k vs the record, mean over layers), ``routing_mismatch_l{i}`` per
        layer, ``routing_mismatch_used`` (experts used vs the record: 0 under replay), ``routing_tokens``."""
        if self.mismatched is None or self.slots == 0:
            return {}
        per_layer = (self.mismatched.float() / self.slots).tolist()
        out = {"routing_mismatch": float(np.mean(per_layer)),
               "routing_mismatch_used": float((self.replayed_mismatched.float() / self.slots).mean()),
               "routing_tokens": float(self.forced_tokens)}
        out.update({f"routing_mismatch_l{i}": float(v) for i, v in enumerate(per_layer)})
        return out


def mismatch_counts(recorded: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Per layer, how many recorded experts are missing from ``chosen`` (both (N, L, K)); slot order is ignored."""
    hit = (recorded.unsqueeze(-1) == chosen.long().unsqueeze(-2)).any(dim=-1)  # (N, L, K): recorded slot found
    return (~hit).sum(dim=(0, 2))
