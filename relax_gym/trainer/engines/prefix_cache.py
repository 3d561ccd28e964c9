"""The embedded engine's prefix cache: the KV of an answered request, reused by the request that continues it.

A multi-turn episode sends its whole conversation at every turn: the previous prompt, the tokens the engine
generated for it, then the tool's reply. Without a cache the engine prefills all of it again. SGLang keeps a radix
tree of KV blocks for this; the embedded engine keeps something simpler that covers the agentic case: when a
request ends, its KV cache (prompt and generated tokens, all but the last sampled one, which was never fed) is
kept under those token ids; a later request whose ids *start with* a kept sequence takes that entry and prefills
only the rest.

An entry is used only when reusing it cannot change the answer: same weight version, the rest of the prompt holds no
media placeholder (its media would need the towers), and the request's media tensors are bit-equal to the ones the
entry was computed with (the same ids with another picture are another prompt). An entry is taken once (an
episode's next turn continues it; nothing else does) and the cache holds at most ``max_tokens`` tokens, dropping
the least recently stored first. :meth:`PrefixCache.clear` empties it (``flush_cache``, weight updates).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from relax_gym.trainer.engines.shared_prefill import same_media

__all__ = ["PrefixCache", "PrefixEntry"]


@dataclass(frozen=True)
class PrefixEntry:
    ids: tuple[int, ...]  # the tokens whose keys and values ``layers`` hold, in order
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per decoder layer: keys, values of shape (1, H, len, D)
    delta: int  # the row's multimodal rope offset
    mm: Mapping[str, torch.Tensor]  # the media tensors its prompt was encoded with
    version: str  # the weight version that computed it


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = int(max_tokens)
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def put(self, entry: PrefixEntry) -> None:
        n = len(entry.ids)
        if n == 0 or n > self.max_tokens:
            return
        with self._lock:
            old = self._entries.pop(entry.ids, None)
            if old is not None:
                self._tokens -= len(old.ids)
            self._entries[entry.ids] = entry
            self._tokens += n
            while self._tokens > self.max_tokens:
                _, dropped = self._entries.popitem(last=False)
                self._tokens -= len(dropped.ids)

    def take(self, ids: Sequence[int], mm: Mapping[str, torch.Tensor], version: str,
             media_token_ids: set[int]) -> PrefixEntry | None:
        """The longest entry that ``ids`` continue (at least one token more) and that may be reused for them
        (module doc); it leaves the cache. None when there is none."""
        ids = tuple(ids)
        with self._lock:
            best: PrefixEntry | None = None
            for key, entry in self._entries.items():
                n = len(key)
                if n < len(ids) and (best is None or n > len(best.ids)) and ids[:n] == key:
                    best = entry
            if best is None:
                return None
            n = len(best.ids)
            if best.version != version or any(t in media_token_ids for t in ids[n:]) or not same_media(best.mm, mm):
                return None
            del self._entries[best.ids]
            self._tokens -= n
            return best

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tokens = 0
