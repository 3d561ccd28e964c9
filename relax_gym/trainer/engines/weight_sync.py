"""The torch.distributed side of SGLang's ``init_weights_update_group`` / ``update_weights_from_distributed``.

A weight-update group is a process group of ``world_size`` ranks outside the default group: the trainer is
rank 0, each engine joins as rank ``rank_offset`` (the embedded engine has one tensor-parallel rank). The group
meets through a ``TCPStore`` served by rank 0 at ``master_address:master_port`` (keys under ``group_name/``).
For each ``update_weights_from_distributed`` call the engine receives, in the order of ``names``, one broadcast
from rank 0 per tensor, allocated with the announced ``dtypes`` / ``shapes``.

Only the ``gloo`` backend is built here (CPU tensors). The group is created from public torch classes
(``TCPStore``, ``PrefixStore``, ``ProcessGroupGloo``) and used directly, without registering it as a default or
``new_group`` group, so a process can hold it next to its own default group. A trainer must build its end with
:class:`WeightUpdateGroup` too: SGLang's own helper goes through torch-internal group helpers whose store key
layout is not guaranteed to match.

Trainer side, against an engine behind :mod:`~relax_gym.trainer.engines.http_server`::

    group = init_weights_update_group_pair(client, "127.0.0.1", port)       # both ends meet
    push_weights_distributed(client, group, model.state_dict(), weight_version="7")
    client.destroy_weights_update_group(); group.destroy()
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["WeightUpdateGroup", "dtype_from_name", "dtype_name", "init_weights_update_group_pair", "push_weights_distributed"]

DEFAULT_GROUP_NAME = "weight_update_group"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (the spelling trainers send in ``dtypes``)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` → ``torch.bfloat16``; ``ValueError`` for anything else."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return value


class WeightUpdateGroup:
    """One end of a weight-update process group (see the module doc). ``rank`` 0 serves the store."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, *,
                 group_name: str = DEFAULT_GROUP_NAME, backend: str = "gloo", timeout_s: float = 60.0) -> None:
        if backend != "gloo":
            raise ValueError(f"backend {backend!r} is not available here: the CPU weight-update group uses 'gloo'")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.master_address, self.master_port = master_address, int(master_port)
        self.rank, self.world_size = int(rank), int(world_size)
        self.group_name, self.backend = group_name, backend
        timeout = datetime.timedelta(seconds=timeout_s)
        self._store = dist.TCPStore(master_address, self.master_port, world_size, is_master=(rank == 0),
                                    timeout=timeout, wait_for_workers=False)
        prefix = dist.PrefixStore(f"{group_name}/", self._store)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        if master_address in _LOOPBACK:
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        else:
            options._devices = [dist.ProcessGroupGloo.create_default_device()]
        self._pg: Any = dist.ProcessGroupGloo(prefix, self.rank, self.world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Broadcast ``tensor`` (CPU, contiguous) from ``src`` in place; returns it."""
        if self._pg is None:
            raise RuntimeError(f"weight update group {self.group_name!r} was destroyed")
        options = dist.BroadcastOptions()
        options.rootRank = int(src)
        self._pg.broadcast([tensor], options).wait()
        return tensor

    def barrier(self) -> None:
        if self._pg is None:
            raise RuntimeError(f"weight update group {self.group_name!r} was destroyed")
        self._pg.barrier().wait()

    def destroy(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort; older torch builds lack shutdown()
                pass
        self._store = None

    @property
    def alive(self) -> bool:
        return self._pg is not None

    def __repr__(self) -> str:
        return (f"WeightUpdateGroup({self.group_name!r}, rank {self.rank}/{self.world_size}, "
                f"{self.master_address}:{self.master_port}, {'alive' if self.alive else 'destroyed'})")


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def init_weights_update_group_pair(client: Any, master_address: str, master_port: int, *, world_size: int = 2,
                                   rank_offset: int = 1, group_name: str = DEFAULT_GROUP_NAME,
                                   timeout_s: float = 60.0) -> WeightUpdateGroup:
    """Trainer side: ask the engine (``client``: an :class:`~relax_gym.trainer.engines.client.EngineClient`) to
    join as ``rank_offset`` while this process joins as rank 0; returns the trainer's end. With ``world_size``
    above 2 the other engines must be asked to join (by their own clients) before this returns."""
    thread, box = _in_thread(lambda: client.init_weights_update_group(
        master_address, master_port, rank_offset, world_size, group_name=group_name, backend="gloo"))
    try:
        group = WeightUpdateGroup(master_address, master_port, 0, world_size, group_name=group_name, timeout_s=timeout_s)
    finally:
        thread.join(timeout_s)
    if "error" in box:
        raise box["error"]
    return group


def push_weights_distributed(client: Any, group: WeightUpdateGroup,
                             named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], *,
                             weight_version: str | None = None, flush_cache: bool = True,
                             timeout_s: float = 300.0) -> Any:
    """Trainer side of one ``update_weights_from_distributed``: announce names / dtypes / shapes over HTTP (in a
    thread) and broadcast each tensor from rank 0 in that order. Returns the engine's response."""
    items = [(str(n), t.detach().to("cpu").contiguous()) for n, t in
             (named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)]
    names = [n for n, _ in items]
    dtypes = [dtype_name(t.dtype) for _, t in items]
    shapes = [list(t.shape) for _, t in items]
    thread, box = _in_thread(lambda: client.update_weights_from_distributed(
        names, dtypes, shapes, group_name=group.group_name, weight_version=weight_version, flush_cache=flush_cache))
    try:
        for _, tensor in items:
            group.broadcast(tensor, src=0)
    finally:
        thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"the engine did not answer update_weights_from_distributed within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")
