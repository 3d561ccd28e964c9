"""Every weight push behind one interface: ``pusher.push(state_dict, version) -> PushReport``.

:func:`make_pusher` builds the pusher a run's config asks for; the colocate loop and the async actor role both
use it, and nothing else pushes weights:

- colocate, ``inference.engine: embedded``: :class:`LocalPush`, the tensors copied into the engine object living
  in this process (no serialisation, no HTTP);
- colocate, ``inference.engine: sglang``: :class:`DCSPush` over a coordinator of the one server, with
  ``inference.sglang.weight_sync`` (``nccl`` falling back to ``disk``, or ``disk``);
- async mode: :class:`DCSPush` over the run's shared coordinator (a Ray actor, see
  :mod:`~relax_gym.trainer.dcs.service`): ``tcp`` (a gloo weight-update group) for embedded engines, SGLang's
  transport otherwise. The engines receive through SGLang's ``/init_weights_update_group`` +
  ``/update_weights_from_distributed``; the embedded engine does so with the
  :class:`~relax_gym.trainer.dcs.group.GroupReceiver` its composer handed it.

The config keys are ``inference.engine`` and ``inference.sglang.weight_sync`` / ``inference.sglang.disk_dir``
(:func:`weight_transport`, :func:`push_transport`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from relax_gym.trainer.dcs.client import DCSClient
from relax_gym.trainer.dcs.coordinator import DCSCoordinator
from relax_gym.trainer.dcs.errors import DCSPushError, PushReport, Version
from relax_gym.trainer.dcs.link import EngineAPI
from relax_gym.trainer.dcs.service import SharedCoordinator
from relax_gym.trainer.dcs.transports import Transport

__all__ = ["DCSPush", "LocalPush", "WeightPush", "in_thread", "make_pusher", "push_transport", "weight_transport"]

log = logging.getLogger(__name__)

MAX_DEAD_ENGINES = 4  # engines dropped (and pushes retried) within one push at most


class _WeightSync(Protocol):
    @property
    def weight_sync(self) -> str: ...

    @property
    def disk_dir(self) -> str | None: ...


class InferenceSettings(Protocol):
    """What a push reads of the ``inference:`` section (the engines' ``InferenceSection`` has it): declared here, so
    the DCS imports neither the engines nor the config tree."""

    @property
    def engine(self) -> str: ...

    @property
    def sglang(self) -> _WeightSync: ...


@runtime_checkable
class WeightPush(Protocol):
    """Sends a state dict to the engines as ``version``; returns when they all serve it."""

    def push(self, state_dict: Mapping[str, torch.Tensor], version: Version) -> PushReport: ...

    def close(self) -> None: ...


def weight_transport(inference: InferenceSettings) -> str:
    """The DCS transport name of a run's coordinator: ``tcp`` for embedded engines, ``inference.sglang.weight_sync``
    for SGLang."""
    return inference.sglang.weight_sync if inference.engine == "sglang" else "tcp"


def push_transport(name: str, *, disk_dir: str | None = None) -> str | Transport:
    """What a :class:`~relax_gym.trainer.dcs.client.DCSClient` pushes with for a coordinator whose transport is
    ``name``: ``nccl`` becomes NCCL with the disk fallback; other names are used as they are."""
    if name == "nccl":
        from relax_gym.trainer.dcs.fallback import NcclOrDiskTransport

        return NcclOrDiskTransport(disk_dir=disk_dir)
    return name


class LocalPush:
    """The tensors copied straight into an engine object in this process (``engine``: anything with the embedded
    engine's ``load_state_dict(named_tensors, weight_version=...)``); applied between batches, never mid-batch."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def push(self, state_dict: Mapping[str, torch.Tensor], version: Version) -> PushReport:
        t0 = time.perf_counter()
        self.engine.load_state_dict(state_dict, weight_version=str(version))
        nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
        seconds = time.perf_counter() - t0
        return PushReport(bytes=nbytes, seconds=seconds, buckets=1, transport="local", version=version, engines=1,
                          phases={"load": seconds})

    def close(self) -> None:
        pass


class DCSPush:
    """A DCS push (pause → load → flush → continue on every engine the coordinator knows).

    ``coordinator``: a :class:`~relax_gym.trainer.dcs.coordinator.DCSCoordinator`, or the run's coordinator actor
    handle. An engine that cannot be reached before any engine was paused or loaded anything (its replica died;
    Serve restarts it under a new URL, which registers itself; found while staging or at the pause step) is
    removed from the coordinator and the push is tried again: no engine changed, so the retry is safe. Any other
    failure is raised as the DCS reports it."""

    def __init__(self, coordinator: Any, *, names: Mapping[str, str] | None = None, disk_dir: str | None = None,
                 transport: str | Transport | None = None) -> None:
        self.coordinator = coordinator
        shared = coordinator if isinstance(coordinator, DCSCoordinator) else SharedCoordinator(coordinator)
        # nccl (SGLang engines) falls back to disk (``disk_dir``: a directory the engines see) when it cannot be used
        if transport is None or isinstance(transport, str):
            transport = push_transport(transport or shared.push_plan().transport, disk_dir=disk_dir)
        self.client = DCSClient(shared, names=names, transport=transport, disk_dir=disk_dir)

    def push(self, state_dict: Mapping[str, torch.Tensor], version: Version) -> PushReport:
        for _ in range(MAX_DEAD_ENGINES):
            try:
                return self.client.push(state_dict, version)
            except DCSPushError as exc:
                if not exc.untouched or exc.url is None or _reachable(exc.url):
                    raise
                log.warning("engine %s is gone; removed from the DCS coordinator, pushing version %s again", exc.url, version)
                self._remove(exc.url)
                if not self._engines():  # every engine died: their replacements register and catch up on their own
                    log.warning("no engine is left to push version %s to; the replaced ones will ask for it", version)
                    return PushReport(0, 0.0, 0, self.client.transport.name, version, engines=0)
        return self.client.push(state_dict, version)

    def _engines(self) -> tuple:
        return tuple(self.client.coordinator.push_plan().engines)

    def _remove(self, url: str) -> None:
        if isinstance(self.coordinator, DCSCoordinator):
            self.coordinator.remove_engine(url)
        else:
            import ray

            ray.get(self.coordinator.remove_engine.remote(url))

    def close(self) -> None:
        self.client.close()


def make_pusher(inference: InferenceSettings, *, names: Mapping[str, str] | None = None, engine: Any = None,
                urls: list[str] | tuple[str, ...] = (), coordinator: Any = None) -> WeightPush:
    """The pusher a run uses (see the module doc). ``coordinator``: the run's shared coordinator (async mode);
    else ``engine``: the embedded engine object in this process (colocate), or ``urls``: the engines a new
    coordinator pushes to (colocate with SGLang). ``names``: state_dict key → checkpoint name
    (:func:`~relax_gym.trainer.dcs.names.checkpoint_names`)."""
    disk_dir = inference.sglang.disk_dir
    if coordinator is not None:
        return DCSPush(coordinator, names=names, disk_dir=disk_dir)
    if engine is not None:
        return LocalPush(engine)
    if not urls:
        raise ValueError("make_pusher needs a coordinator, an engine object or engine URLs")
    return DCSPush(DCSCoordinator(list(urls), transport=weight_transport(inference)), names=names, disk_dir=disk_dir)


class _InThread:
    def __init__(self, pusher: WeightPush) -> None:
        self.pusher = pusher

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: Version) -> PushReport:
        return await asyncio.to_thread(self.pusher.push, state_dict, version)

    def close(self) -> None:
        self.pusher.close()


def in_thread(pusher: WeightPush) -> _InThread:
    """``await in_thread(pusher).push(state_dict, version)``: the same push in a worker thread, for a role's event
    loop (the async actor role)."""
    return _InThread(pusher)


def _reachable(url: str) -> bool:
    with EngineAPI(url, timeout_s=5.0, retries=1) as api:
        return api.health()
