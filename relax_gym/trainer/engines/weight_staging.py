"""Staged distributed weight updates: buckets received while the engine generates, applied in one swap.

A plain ``/update_weights_from_distributed`` copies each bucket into the model as it arrives, so the engine must
be paused for the whole transfer. A staged push (our extension: the same request with a ``stage_id`` and a
``seq``) receives every bucket into buffers of its own while batches keep running on the old weights; then
``/apply_staged_weights`` (the engine paused) points the model's tensors at the received ones. The pause thus
covers a pointer swap per tensor instead of the transfer and a copy.

:class:`WeightStaging` keeps one stage at a time:

- calls of a stage are received in ``seq`` order whatever order their HTTP requests arrive in (the actor sends the
  next bucket's request while the current one is still on the wire, and both ends of the broadcast must agree on
  the order);
- a call of a new ``stage_id`` drops what an unfinished older stage received (a push that failed half way);
- buffers are reused: a tensor swapped into the model keeps its bucket's buffer alive, so the engine holds the
  live weights and, once a second push has been applied, one more copy of them in spare buffers (two sets taking
  turns). Fresh memory is slower to fill than reused memory (every page faults once), which is why spares are
  kept rather than freed.

The model's tensors are swapped (``tensor.data = received``) where dtype, shape and device match and the tensor is
not a view of another; otherwise the received values are copied in. Swapping keeps the ``Parameter`` objects (and
tied weights, which share one) as they are.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from relax_gym.trainer.engines.errors import EngineRequestError

__all__ = ["StagedCall", "WeightStaging", "swap_in"]


@dataclass
class StagedCall:
    """One received call of a stage: ``keys`` (the model's state_dict keys) and their ``tensors`` (views of
    ``buffer``, or tensors of their own on the per-tensor path, then ``buffer`` is None)."""

    keys: list[str]
    tensors: list[torch.Tensor]
    buffer: torch.Tensor | None = None


@dataclass
class _Stage:
    stage_id: str
    next_seq: int = 0
    calls: list[StagedCall] = field(default_factory=list)
    failed: str | None = None


class WeightStaging:
    """The engine's staging area (see the module doc). Thread-safe; ``timeout_s`` bounds how long a call waits
    for the calls before it."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = float(timeout_s)
        self._cv = threading.Condition()
        self._stage: _Stage | None = None
        self._retired: deque[str] = deque(maxlen=64)  # stages dropped or applied: their late calls are refused
        self._spare: list[torch.Tensor] = []  # uint8 buffers no model tensor points into
        self._live: list[torch.Tensor] = []  # buffers swapped into the model

    # ------------------------------------------------------------------------------------------ receiving

    def wait_turn(self, stage_id: str, seq: int) -> None:
        """Block until every call before ``seq`` of ``stage_id`` has been received; the first call of a new stage
        drops an unfinished older one. :class:`EngineRequestError` for a stage that was dropped or failed."""
        with self._cv:
            if self._stage is None or self._stage.stage_id != stage_id:
                if stage_id in self._retired:
                    raise EngineRequestError(f"weight stage {stage_id!r} was discarded")
                self._drop_locked()
                self._stage = _Stage(stage_id)
            stage = self._stage
            ok = self._cv.wait_for(lambda: self._stage is not stage or stage.failed or stage.next_seq >= seq, self.timeout_s)
            if self._stage is not stage:
                raise EngineRequestError(f"weight stage {stage_id!r} was discarded while call {seq} waited")
            if stage.failed:
                raise EngineRequestError(f"weight stage {stage_id!r} failed earlier: {stage.failed}")
            if not ok:
                raise EngineRequestError(f"call {seq} of weight stage {stage_id!r} waited {self.timeout_s:g} s for call "
                                         f"{stage.next_seq}")
            if stage.next_seq != seq:
                raise EngineRequestError(f"call {seq} of weight stage {stage_id!r} was received already")

    def buffer(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A ``uint8`` buffer of ``nbytes`` on ``device``: the smallest spare one that fits, else a new one."""
        with self._cv:
            fits = [b for b in self._spare if b.numel() >= nbytes and b.device == device]
            if fits:
                best = min(fits, key=lambda b: b.numel())
                self._spare = [b for b in self._spare if b is not best]
                return best
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def add(self, stage_id: str, seq: int, call: StagedCall) -> None:
        """Record call ``seq`` as received (the next call may go)."""
        with self._cv:
            stage = self._stage
            if stage is None or stage.stage_id != stage_id or stage.next_seq != seq:
                self._recycle_locked(call.buffer)
                raise EngineRequestError(f"weight stage {stage_id!r} was discarded while call {seq} was received")
            stage.calls.append(call)
            stage.next_seq += 1
            self._cv.notify_all()

    def fail(self, stage_id: str, reason: str, buffer: torch.Tensor | None = None) -> None:
        """A call of ``stage_id`` could not be received: the calls after it fail instead of waiting."""
        with self._cv:
            self._recycle_locked(buffer)
            if self._stage is not None and self._stage.stage_id == stage_id and self._stage.failed is None:
                self._stage.failed = reason
            self._cv.notify_all()

    # ------------------------------------------------------------------------------------------ ending a stage

    def take(self, stage_id: str, calls: int) -> list[StagedCall]:
        """The ``calls`` received calls of ``stage_id``, ending the stage; :class:`EngineRequestError` (nothing
        ended) when the stage is not the current one, failed, or has another number of calls."""
        with self._cv:
            stage = self._stage
            if stage is None or stage.stage_id != stage_id:
                raise EngineRequestError(f"no weight stage {stage_id!r} to apply (it was discarded or never began)")
            if stage.failed:
                raise EngineRequestError(f"weight stage {stage_id!r} failed: {stage.failed}")
            if stage.next_seq != calls:
                raise EngineRequestError(f"weight stage {stage_id!r} holds {stage.next_seq} call(s), the push sent {calls}")
            self._stage = None
            self._retired.append(stage_id)
            self._cv.notify_all()
            return stage.calls

    def settle(self, received: Sequence[torch.Tensor], live_ptrs: set[int]) -> None:
        """After an apply: of the buffers just ``received`` and those swapped in before, the ones a model tensor
        points into (``live_ptrs``: the storages the model's tensors use) stay live, the others become spares."""
        with self._cv:
            live, spare = [], []
            for buf in [*self._live, *received]:
                (live if buf.untyped_storage().data_ptr() in live_ptrs else spare).append(buf)
            self._live = live
            self._spare.extend(spare)

    def discard(self, stage_id: str | None = None) -> bool:
        """Drop the current stage (only if it is ``stage_id``, when given); whether one was dropped."""
        with self._cv:
            if self._stage is None or (stage_id is not None and self._stage.stage_id != stage_id):
                return False
            self._drop_locked()
            self._cv.notify_all()
            return True

    @property
    def spare_bytes(self) -> int:
        with self._cv:
            return sum(b.numel() for b in self._spare)

    def _drop_locked(self) -> None:
        stage, self._stage = self._stage, None
        if stage is None:
            return
        self._retired.append(stage.stage_id)
        for call in stage.calls:
            self._recycle_locked(call.buffer)

    def _recycle_locked(self, buffer: torch.Tensor | None) -> None:
        if buffer is not None:
            self._spare.append(buffer)


def swap_in(target: torch.Tensor, new: torch.Tensor) -> bool:
    """Make ``target`` hold ``new``'s values: by pointing it at ``new`` (True) where dtype, shape and device match
    and ``target`` is not a view of another tensor, else by copying (False)."""
    if (target.dtype == new.dtype and target.shape == new.shape and target.device == new.device
            and target._base is None and new.is_contiguous()):
        target.data = new
        return True
    target.copy_(new)
    return False
