"""What the embedded engine hands to ``model.generate`` for one batch: the pending rows, a logits processor that
records each sampled token's log-prob under the sampling distribution (before truncation), and a per-row stopping
criterion (max tokens, stop ids, stop strings, aborts)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria

from relax_gym.trainer.engines.protocol import EngineRequest, FinishReason, SamplingParams

ABORT_MESSAGE = "aborted by pause_generation(mode='abort') / abort_all_requests"


@dataclass
class PromptRow:
    """What ``processor.collate`` needs of a row."""

    input_ids: list[int]
    loss_mask: list[int]
    mm: dict[str, torch.Tensor]


@dataclass
class PendingRequest:
    req: EngineRequest
    input_ids: list[int]
    mm: dict[str, torch.Tensor]
    stop_ids: frozenset[int]
    stop_strs: list[str]
    submitted: float
    future: Future = field(default_factory=Future)
    # called with each sampled token id as the running batch samples it (the scheduler thread; must not block):
    # what streams a completion as it is generated. The answer in ``future`` holds every token either way.
    on_token: Callable[[int], None] | None = None

    @property
    def sp(self) -> SamplingParams:
        return self.req.sampling_params


class LogprobRecorder(LogitsProcessor):
    """Masks the control tokens and records ``log_softmax(scores / T)`` per step; the log-prob of the token
    sampled at step ``s`` is gathered when step ``s + 1`` sees it (and by :meth:`finish` for the last one).
    It runs after transformers' own processors (suppress tokens) and before the warpers (temperature, top-k,
    top-p, min-p), so it sees the untruncated distribution."""

    def __init__(self, temperature: float, control_ids: torch.Tensor, prompt_len: int, top_n: int) -> None:
        self.temperature = float(temperature)
        self.control_ids = control_ids
        self.prompt_len = prompt_len
        self.top_n = top_n
        self.prev: torch.Tensor | None = None
        self.token_logprobs: list[torch.Tensor] = []
        self.top: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.control_ids.numel():
            scores = scores.index_fill(1, self.control_ids.to(scores.device), float("-inf"))
        if input_ids.shape[1] > self.prompt_len:
            self._take(input_ids[:, -1])
        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        self.prev = logp
        if self.top_n:
            values, indices = logp.topk(min(self.top_n, logp.shape[-1]), dim=-1)
            self.top.append((values.cpu(), indices.cpu()))
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        assert self.prev is not None
        self.token_logprobs.append(self.prev.gather(1, tokens.view(-1, 1).to(self.prev.device)).squeeze(1).cpu())

    def finish(self, sequences: torch.Tensor) -> None:
        if len(self.token_logprobs) < sequences.shape[1] - self.prompt_len and self.prev is not None:
            self._take(sequences[:, -1])

    def row(self, b: int, n: int) -> list[float]:
        return [float(self.token_logprobs[s][b]) for s in range(n)]

    def top_row(self, b: int, n: int) -> list[list[tuple[float, int]]]:
        return [list(zip(self.top[s][0][b].tolist(), self.top[s][1][b].tolist())) for s in range(min(n, len(self.top)))]


class RowStopper(StoppingCriteria):
    """Per-row finishing in SGLang's order (length, stop token, stop string); everything on abort."""

    def __init__(self, rows: Sequence[PendingRequest], prompt_len: int, decode: Any, abort: threading.Event) -> None:
        self.rows = rows
        self.prompt_len = prompt_len
        self.decode = decode
        self.abort = abort
        self.ends: list[int | None] = [None] * len(rows)
        self.reasons: list[FinishReason | None] = [None] * len(rows)
        self.tails = [stop_tail(p) for p in rows]

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        n = input_ids.shape[1] - self.prompt_len
        aborted = self.abort.is_set()
        last = input_ids[:, -1].tolist()
        for b, p in enumerate(self.rows):
            if self.ends[b] is not None:
                continue
            start = max(self.prompt_len, input_ids.shape[1] - self.tails[b])
            reason = row_finish(p, n, last[b], aborted, lambda b=b, start=start: self.decode(input_ids[b, start:].tolist()))
            if reason is not None:
                self.ends[b], self.reasons[b] = n, reason
        return torch.tensor([e is not None for e in self.ends], dtype=torch.bool, device=input_ids.device)


def row_finish(p: PendingRequest, n: int, last: int, aborted: bool, tail: Any) -> FinishReason | None:
    """Why a request's row ends after its ``n``-th generated token ``last``, in SGLang's order (abort, length, stop
    token, stop string), or None while it goes on. ``tail()`` decodes the last generated tokens (enough to hold
    the longest stop string); it is called only for requests with stop strings."""
    if aborted:
        return FinishReason(type="abort", message=ABORT_MESSAGE)
    if n >= p.sp.max_new_tokens:
        return FinishReason(type="length", length=p.sp.max_new_tokens)
    if last in p.stop_ids:
        return FinishReason(type="stop", matched=int(last))
    if p.stop_strs:
        text = tail()
        matched = next((s for s in p.stop_strs if s in text), None)
        if matched is not None:
            return FinishReason(type="stop", matched=matched)
    return None


def stop_tail(p: PendingRequest) -> int:
    """How many generated tokens :func:`row_finish`'s ``tail`` must decode for request ``p``."""
    return max((len(s) for s in p.stop_strs), default=0) + 2


def finite_or_none(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None
