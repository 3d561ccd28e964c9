"""Continuous batching for the embedded engine: requests join and leave the running batch at every decoding step.

With static batching (one ``model.generate`` per scheduler round) a request that arrives while a batch decodes
waits for the whole batch, and every row of a batch is computed until the batch's longest row ends: on a
multi-turn agentic workload, where turns arrive one by one as tool calls return and answers differ in length, the
engine spends much of its time on rows that already ended and runs many small batches one after the other.
:class:`ContinuousBatch` keeps one running batch instead, as SGLang does:

- **admit**: queued requests are prefilled together (left-padded; identical prompts once, see
  :mod:`~relax_gym.trainer.engines.shared_prefill`), their first token is sampled, and their KV cache joins the
  running one (both left-padded to a common length; the attention mask hides the padding);
- **step**: one forward of every running row's last token, one token sampled per row;
- a row that ends is **answered at once** and dropped from the batch (and the cache's leading columns that only
  padding uses are cut).

Positions are each row's own: for multimodal rope (Qwen2.5-Omni: 3-D positions, ``model.model.rope_deltas``) the
row's offset from its prefill is kept and every decoded token gets ``text index + offset`` on all three axes, as
the model's own decoding does. Sampling and log-probs follow :mod:`~relax_gym.trainer.engines.embedded`'s rules per
row: control tokens masked, the log-prob under ``log_softmax(masked / T)`` before truncation, then temperature,
top-k, top-p, min-p (transformers' warpers, in ``generate``'s order) and a multinomial draw (argmax when greedy);
rows with equal warpers are sampled together. Finishing (length, stop token, stop string, abort) is
:func:`~relax_gym.trainer.engines.generation_hooks.row_finish`, the static path's rule.

The engine drives it from its scheduler thread under its model lock, so weights change only between steps; each
answer reports the weight version its request was admitted under (the oldest that produced its tokens).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from relax_gym.trainer.engines.generation_hooks import (
    PendingRequest,
    PromptRow,
    row_finish,
    stop_tail,
)
from relax_gym.trainer.engines.prefix_cache import PrefixCache, PrefixEntry
from relax_gym.trainer.engines.protocol import FinishReason
from relax_gym.trainer.engines.shared_prefill import plan_sharing, prefill

__all__ = ["ContinuousBatch"]

logger = logging.getLogger(__name__)


@dataclass
class _Row:
    p: PendingRequest
    version: str  # the weight version the request was admitted under
    position: int  # the text index of the token fed next (real tokens already in the cache)
    delta: int  # multimodal rope offset of this row (0 for plain rope)
    last: int = -1  # the last sampled token: fed at the next step
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[float, int]]] = field(default_factory=list)


class ContinuousBatch:
    """The running batch of one engine. ``engine``: the :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine`
    (its model, processor, control tokens, tokenizer lock, ``_resolve`` and stats are used)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model = engine.model
        self.body = getattr(self.model, "model", None) or self.model
        self.mrope = hasattr(self.body, "rope_deltas")  # Qwen2-VL / Qwen2.5-Omni: 3-D positions
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # (B, L) 1 where the cache holds a real token
        tokens = int(getattr(engine, "prefix_cache_tokens", 0) or 0)
        self.prefix = PrefixCache(tokens) if tokens > 0 else None  # ended rows' KV, for the requests that continue them

    def __len__(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------------------------------ admit / step

    def admit(self, pending: list[PendingRequest], version: str) -> None:
        """Prefill ``pending``, sample their first tokens, answer those that already ended, and add the others to
        the running batch."""
        for p in [p for p in pending if p.sp.max_new_tokens == 0]:
            self.engine._resolve(p, [], [] if p.req.return_logprob else None, FinishReason(type="length", length=0), version)
        pending = [p for p in pending if p.sp.max_new_tokens > 0]
        if self.prefix is not None:  # requests that continue an ended one prefill only what is new
            media = set(self.engine.processor.media_token_ids.values())
            misses = []
            for p in pending:
                entry = self.prefix.take(p.input_ids, p.mm, version, media)
                if entry is None:
                    misses.append(p)
                else:
                    self._continue(p, entry, version)
            pending = misses
        if not pending:
            return
        device = self.engine._device
        plan = None if not self.engine.share_prefill else plan_sharing(
            [(p.input_ids, p.mm) for p in pending], set(self.engine.processor.media_token_ids.values()))
        rows_in = pending if plan is None else [pending[u] for u in plan.unique]
        batch = self.engine.processor.collate([PromptRow(p.input_ids, [0] * len(p.input_ids), p.mm) for p in rows_in],
                                              padding_side="left")
        batch.pop("loss_mask", None)
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.inference_mode():
            if plan is None:
                last, cache = self._forward_last(**batch, use_cache=True)
                mask = batch["attention_mask"]
                deltas = self._deltas(len(pending))  # the prefill set them (one row per request)
            else:  # the distinct prompts over all tokens but the last, spread to their rows; then the last token
                inputs = prefill(self.model, batch, plan.index)
                cache, mask = inputs["cache"], inputs["attention_mask"]
                deltas = self._deltas(len(pending))
                positions = [int(n) - 1 for n in mask.sum(-1).tolist()]
                last, cache = self._forward_last(input_ids=inputs["input_ids"][:, -1:], attention_mask=mask,
                                                 cache=cache, position_ids=self._position_ids(positions, deltas),
                                                 use_cache=True)
                self.engine._count("shared_prefill_rows", plan.saved_rows)
        new = [_Row(p, version, position=len(p.input_ids), delta=d) for p, d in zip(pending, deltas)]
        keep = self._answer_ended(new, self._sample(new, last))
        if not keep:
            return
        index = torch.tensor(keep, dtype=torch.long, device=device)
        cache.batch_select_indices(index)
        self._join([new[i] for i in keep], cache, mask[index])

    def step(self) -> None:
        """One decoding step of every running row; ended rows are answered and dropped."""
        if not self.rows:
            return
        device = self.engine._device
        ids = torch.tensor([[r.last] for r in self.rows], dtype=torch.long, device=device)
        self.mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=self.mask.dtype, device=device)], dim=1)
        positions = [r.position for r in self.rows]
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=self.mask, cache=self.cache,
                             position_ids=self._position_ids(positions, [r.delta for r in self.rows]), use_cache=True)
        self.cache = _cache_of(out)
        for r in self.rows:
            r.position += 1
        keep, ended = self._sample(self.rows, out.logits[:, -1, :])
        if ended:
            if self.prefix is not None:  # stored before the answers go out: a next turn sent at once finds it
                self._stash([i for i, _ in ended])
            self._answer_ended(self.rows, (keep, ended))
            self._select(keep)

    def abort(self, message_reason: FinishReason) -> None:
        """Answer every running row with what it generated so far and ``message_reason`` (an abort)."""
        for r in self.drop_all():
            self._answer(r, message_reason)

    def drop_all(self) -> list[_Row]:
        """Empty the batch; the rows it held (their requests not answered)."""
        rows, self.rows, self.cache, self.mask = self.rows, [], None, None
        return rows

    # ------------------------------------------------------------------------------------------ internals

    def _continue(self, p: PendingRequest, entry: PrefixEntry, version: str) -> None:
        """Admit ``p``, whose ids continue ``entry``: its KV is the entry's, and only the rest is prefilled."""
        device = self.engine._device
        n, total = len(entry.ids), len(p.input_ids)
        cache = DynamicCache(ddp_cache_data=[(k.to(device), v.to(device)) for k, v in entry.layers])
        mask = torch.ones(1, total, dtype=torch.long, device=device)
        ids = torch.tensor([p.input_ids[n:]], dtype=torch.long, device=device)
        pos = torch.arange(n, total, dtype=torch.long, device=device).view(1, -1) + entry.delta
        with torch.inference_mode():
            last, cache = self._forward_last(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True,
                                             position_ids=pos.unsqueeze(0).expand(3, -1, -1) if self.mrope else pos)
        self.engine._count("prefix_cache_hits", 1)
        self.engine._count("prefix_cached_tokens", n)
        row = _Row(p, version, position=total, delta=entry.delta)
        if self._answer_ended([row], self._sample([row], last)):
            self._join([row], cache, mask)

    def _stash(self, ended: list[int]) -> None:
        """Keep the KV of the rows that just ended (the real tokens of each are the cache's last ``position``
        columns: every row is right-aligned), keyed by the ids it holds: the prompt and all generated tokens but
        the last (never fed)."""
        for i in ended:
            r = self.rows[i]
            ids = (*r.p.input_ids, *r.ids[:-1])
            if len(ids) != r.position:  # a bookkeeping mismatch: keep nothing rather than a wrong cache
                continue
            layers = tuple((layer.keys[i:i + 1, :, -r.position:].clone(), layer.values[i:i + 1, :, -r.position:].clone())
                           for layer in self.cache.layers)
            self.prefix.put(PrefixEntry(ids, layers, r.delta, r.p.mm, r.version))

    def _forward_last(self, **inputs: Any) -> tuple[torch.Tensor, Any]:
        """``(logits of each row's last position (B, V), KV cache)`` of one forward of ``inputs``: all the sampler
        reads. The head runs on the last position only when the model exposes its body and head (``model.model`` /
        ``model.lm_head``, as transformers' causal LMs do; the thinker's own forward is exactly the two): its
        forward would compute the logits of every prompt token -- tokens x vocabulary per row, at Qwen's 151,936
        tokens 0.3 MB per token in bf16, 12 GB for 64 prompts of 650 tokens (an eval batch of NExT-QA clips) -- to
        keep one row of them."""
        head = getattr(self.model, "lm_head", None)
        if head is None or self.body is self.model:
            out = self.model(**inputs)
            return out.logits[:, -1, :], _cache_of(out)
        out = self.body(**inputs)
        return head(out[0][:, -1, :]), _cache_of(out)

    def _deltas(self, n: int) -> list[int]:
        deltas = getattr(self.body, "rope_deltas", None) if self.mrope else None
        if isinstance(deltas, torch.Tensor) and deltas.shape[0] == n:
            return [int(d) for d in deltas.reshape(n, -1)[:, 0].tolist()]
        return [0] * n

    def _position_ids(self, positions: list[int], deltas: list[int]) -> torch.Tensor:
        pos = torch.tensor([p + d for p, d in zip(positions, deltas)], dtype=torch.long, device=self.engine._device).view(-1, 1)
        return pos.unsqueeze(0).expand(3, -1, -1) if self.mrope else pos

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[tuple[int, FinishReason]]]:
        """Sample one token for each of ``rows`` (row i's logits: ``logits[i]``). Returns the indices of the rows
        that go on and ``(index, reason)`` of those that ended (not answered yet: see :meth:`_answer_ended`)."""
        scores = logits.float()
        control = self.engine._control
        if control.numel():
            scores = scores.index_fill(1, control.to(scores.device), float("-inf"))
        chosen: list[int] = [0] * len(rows)
        chosen_logp: list[float] = [0.0] * len(rows)
        tops: dict[int, list[tuple[float, int]]] = {}
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r.p.sp.warper_key(), []).append(i)
        for idx in groups.values():
            sp = rows[idx[0]].p.sp
            sel = torch.tensor(idx, dtype=torch.long, device=scores.device)
            s = scores.index_select(0, sel)
            temperature = 1.0 if sp.greedy else float(sp.temperature)
            logp = torch.log_softmax(s / temperature, dim=-1)
            if sp.greedy:
                picked = s.argmax(dim=-1)
            else:
                warped = s
                for warper in _warpers(sp):
                    warped = warper(None, warped)
                picked = torch.multinomial(torch.softmax(warped, dim=-1), num_samples=1).squeeze(1)
            values = logp.gather(1, picked.view(-1, 1)).squeeze(1).tolist()  # one transfer per group
            for j, (i, token, value) in enumerate(zip(idx, picked.tolist(), values)):
                chosen[i], chosen_logp[i] = int(token), float(value)
                n = rows[i].p.req.top_logprobs_num if rows[i].p.req.return_logprob else 0
                if n:
                    top_v, top_i = logp[j].topk(min(n, logp.shape[-1]))
                    tops[i] = list(zip(top_v.tolist(), top_i.tolist()))
        keep: list[int] = []
        ended: list[tuple[int, FinishReason]] = []
        for i, r in enumerate(rows):
            token = chosen[i]
            r.ids.append(token)
            r.last = token
            if r.p.on_token is not None:
                _tell(r.p, token)
            if r.p.req.return_logprob:
                r.logprobs.append(chosen_logp[i])
                if i in tops:
                    r.top.append(tops[i])
            reason = row_finish(r.p, len(r.ids), token, False, lambda r=r: self.engine._decode(
                r.ids[-stop_tail(r.p):], skip_special_tokens=False))
            if reason is None:
                keep.append(i)
            else:
                ended.append((i, reason))
        return keep, ended

    def _answer_ended(self, rows: list[_Row], sampled: tuple[list[int], list[tuple[int, FinishReason]]]) -> list[int]:
        """Answer the rows of ``rows`` that :meth:`_sample` found ended; the indices of those that go on."""
        keep, ended = sampled
        for i, reason in ended:
            self._answer(rows[i], reason)
        return keep

    def _answer(self, r: _Row, reason: FinishReason) -> None:
        logprobs = r.logprobs if r.p.req.return_logprob else None
        top = r.top if (r.p.req.return_logprob and r.p.req.top_logprobs_num) else None
        self.engine._resolve(r.p, list(r.ids), logprobs, reason, r.version, top=top)

    def _join(self, rows: list[_Row], cache: Any, mask: torch.Tensor) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask = rows, cache, mask
            self._trim()
            return
        length = max(self.mask.shape[1], mask.shape[1])
        for old, add in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, length), _left_pad(add.keys, length)], dim=0)
            old.values = torch.cat([_left_pad(old.values, length), _left_pad(add.values, length)], dim=0)
        self.mask = torch.cat([_left_pad(self.mask, length, dim=1), _left_pad(mask, length, dim=1)], dim=0)
        self.rows = self.rows + rows
        self._trim()

    def _select(self, keep: list[int]) -> None:
        if not keep:
            self.drop_all()
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask.index_select(0, index)
        self.rows = [self.rows[i] for i in keep]
        self._trim()

    def _trim(self) -> None:
        """Cut the leading cache columns that hold padding in every row."""
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else 0
        if first == 0:
            return
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, first:]
            layer.values = layer.values[:, :, first:]


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if not isinstance(cache, DynamicCache):
        raise TypeError(f"continuous batching needs a DynamicCache from the model's forward, got {type(cache).__name__}")
    return cache


def _left_pad(t: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _warpers(sp: Any) -> list[Any]:
    out: list[Any] = []
    if float(sp.temperature) != 1.0:
        out.append(TemperatureLogitsWarper(float(sp.temperature)))
    if sp.top_k and sp.top_k > 0:
        out.append(TopKLogitsWarper(int(sp.top_k)))
    if sp.top_p is not None and float(sp.top_p) < 1.0:
        out.append(TopPLogitsWarper(float(sp.top_p)))
    if sp.min_p and sp.min_p > 0:
        out.append(MinPLogitsWarper(float(sp.min_p)))
    return out


def _tell(p: PendingRequest, token: int) -> None:
    """Hand ``token`` to the request's listener; a listener that fails is dropped (the request goes on: its answer
    still holds every token)."""
    try:
        p.on_token(token)  # type: ignore[misc]
    except Exception:  # noqa: BLE001 - a streaming client's failure must not stop the batch
        logger.exception("a token listener failed; the request %s goes on without it", p.req.rid)
        p.on_token = None
