"""Flattening the next bucket while the current one is on the wire.

A ``flattened_bucket`` call sends one ``uint8`` payload: the bytes of its tensors copied back to back. Done in
line, that copy and the broadcast take turns, and the wire idles while the actor copies. :class:`FlattenAhead`
copies call i+1 in a background thread while call i is broadcast. Two reusable buffers take turns (call i+2
reuses call i's buffer, whose broadcast has completed by the time the caller asks for call i+1's payload), so a
push holds at most two flattened calls beside the state dict; buffers are kept between pushes because filling
fresh memory costs more than the copy itself (every page faults once).

On CUDA (``nccl``) the copy is a kernel queued on the current stream, which already runs ahead of the host and
orders the copy before the broadcast; a thread would only add a second stream to synchronise, so the copy stays
in line there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from relax_gym.trainer.dcs.coordinator import TensorMeta
from relax_gym.trainer.dcs.group import flatten_tensors

__all__ = ["Call", "FlattenAhead"]

Call = Sequence[tuple[TensorMeta, torch.Tensor]]  # one update call: its tensors, in the order announced


class FlattenAhead:
    """The payloads of a push's calls, each prepared while the previous one is sent (see the module doc).
    ``device``: where payloads must be (the group's device)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._worker: ThreadPoolExecutor | None = None

    def payloads(self, calls: Sequence[Call], flat: bool) -> Iterator[list[torch.Tensor]]:
        """For each call in order, the tensors to broadcast: one flattened payload, or with ``flat`` False the
        call's tensors on the device. A payload stays valid until the one after the next is asked for."""
        if not flat:
            for call in calls:
                yield [t.detach().to(self.device).contiguous() for _, t in call]
            return
        if self.device.type != "cpu":
            for i, call in enumerate(calls):
                yield [self._flatten(call, i % 2)]
            return
        worker = self._worker_pool()
        ahead: Future | None = worker.submit(self._flatten, calls[0], 0) if calls else None
        for i in range(len(calls)):
            payload = ahead.result()
            ahead = worker.submit(self._flatten, calls[i + 1], (i + 1) % 2) if i + 1 < len(calls) else None
            yield [payload]

    def close(self) -> None:
        """Stop the background thread and drop the buffers."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._buffers = [None, None]

    def _flatten(self, call: Call, slot: int) -> torch.Tensor:
        wire = [t.detach().to(self.device).contiguous() for _, t in call]
        nbytes = sum(meta.nbytes for meta, _ in call)
        buf = self._buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = self._buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return flatten_tensors(wire, out=buf)

    def _worker_pool(self) -> ThreadPoolExecutor:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcs-flatten")
        return self._worker
