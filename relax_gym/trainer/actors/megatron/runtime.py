"""megatron-core's process state for one trainer process: the default process group and the model-parallel groups.

megatron-core keeps its parallel layout in module globals (``megatron.core.parallel_state``), so it is set up once
per process and shared by every Megatron model made in it. :func:`acquire` sets it up the first time (and counts
its users), :func:`release` tears it down when the last user is done -- only what it set up itself: a process
group that a launcher (``torchrun``) made is left alone.

Two ways in:

- :func:`acquire` (an actor in the trainer's own process): the group it makes has world size 1 -- gloo over
  loopback on a CPU (an in-process store, nothing listens on a port; gloo's device bound to the loopback
  interface), nccl on a GPU. Parallel sizes above 1 need as many processes; asking for them here is one clear error.
- :func:`join_group` (one rank of a rank group, :mod:`~relax_gym.trainer.actors.megatron.group`): this process is
  rank ``r`` of ``world``; the ranks meet at a TCP store on the group's first rank (``master_addr``: loopback
  when every rank is on this machine) and megatron-core's tensor / pipeline / data / expert groups are made.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from relax_gym.trainer.actors.megatron.cpu_patch import apply_cpu_patch, init_rng_tracker

__all__ = ["ParallelSizes", "acquire", "active_users", "release"]

_LOCK = threading.Lock()
_USERS = 0
_OWN_GROUP = False
_OWN_MODEL_PARALLEL = False


@dataclass(frozen=True)
class ParallelSizes:
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    data: int = 1
    expert: int = 1

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline * self.context

    @property
    def world(self) -> int:
        return self.model_parallel * self.data

    @classmethod
    def of(cls, parallel: object) -> ParallelSizes:
        """From the config's ``actor.parallel`` section (``tp``, ``pp``, ``cp``, ``dp``, ``ep``)."""
        return cls(tensor=parallel.tp, pipeline=parallel.pp, context=parallel.cp, data=parallel.dp,  # type: ignore[attr-defined]
                   expert=parallel.ep)  # type: ignore[attr-defined]


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((n for n in names if n in ("lo", "lo0")), None)  # Linux, macOS


@contextlib.contextmanager
def _gloo_on_loopback() -> Iterator[None]:
    """Gloo picks its network interface from ``GLOO_SOCKET_IFNAME`` (else the host name): loopback while the
    groups are made, unless the user chose an interface."""
    if "GLOO_SOCKET_IFNAME" in os.environ or (iface := _loopback_interface()) is None:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def acquire(sizes: ParallelSizes = ParallelSizes(), *, seed: int = 0) -> torch.device:
    """Make sure megatron-core's parallel state exists with ``sizes``; returns the device models go on. A failed
    call leaves nothing of its own behind (with no other user, what it set up is torn down again)."""
    with _LOCK:
        return _acquire_or_undo(sizes, seed)


def _acquire_or_undo(sizes: ParallelSizes, seed: int) -> torch.device:
    """:func:`_acquire_locked`; on failure, with no other user, tear down what was set up (under ``_LOCK``)."""
    try:
        return _acquire_locked(sizes, seed)
    except BaseException:
        if _USERS == 0:
            _teardown_locked()
        raise


def _acquire_locked(sizes: ParallelSizes, seed: int) -> torch.device:
    global _USERS, _OWN_GROUP, _OWN_MODEL_PARALLEL
    import torch.distributed as dist
    from megatron.core import parallel_state

    cuda = torch.cuda.is_available()
    if not cuda:
        apply_cpu_patch()
    if not dist.is_initialized():
        if sizes.world != 1:
            raise ValueError(
                f"tensor x pipeline x data parallel = {sizes.tensor} x {sizes.pipeline} x {sizes.data} needs "
                f"{sizes.world} processes: a rank group (actor.parallel; relax_gym.trainer.actors.megatron.group) "
                "or a launcher's process group, not this single process")
        if cuda:
            torch.cuda.set_device(0)
        with _gloo_on_loopback():
            dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        _OWN_GROUP = True
    elif dist.get_world_size() % sizes.model_parallel:
        raise ValueError(f"world size {dist.get_world_size()} is not a multiple of tensor x pipeline x context "
                         f"parallel = {sizes.model_parallel}")
    if not parallel_state.model_parallel_is_initialized():
        with _gloo_on_loopback():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=sizes.tensor, pipeline_model_parallel_size=sizes.pipeline,
                context_parallel_size=sizes.context, expert_model_parallel_size=sizes.expert)
        _OWN_MODEL_PARALLEL = True
    else:
        have = current_sizes()
        if have != sizes:
            raise ValueError(f"megatron-core is already set up in this process with {have}, not {sizes}")
    if cuda:
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
    else:
        init_rng_tracker()
    _USERS += 1
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def current_sizes() -> ParallelSizes:
    """The layout megatron-core's parallel state holds now (set up by :func:`acquire` or :func:`join_group`)."""
    from megatron.core import parallel_state as ps

    return ParallelSizes(ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                         ps.get_context_parallel_world_size(), ps.get_data_parallel_world_size(),
                         ps.get_expert_model_parallel_world_size())


def join_group(sizes: ParallelSizes, *, rank: int, master_addr: str, master_port: int, seed: int = 0,
               timeout_s: float = 300.0) -> torch.device:
    """Make this process rank ``rank`` of a group of ``sizes.world`` ranks meeting at ``master_addr:master_port``
    (rank 0 hosts the store) and set up megatron-core's parallel groups; returns the device models go on (this
    rank's GPU under ``CUDA_VISIBLE_DEVICES`` as Ray assigns it, else the CPU). Counts as one :func:`acquire`
    user, so :func:`release` tears it down."""
    import datetime

    import torch.distributed as dist

    global _OWN_GROUP
    with _LOCK:
        if dist.is_initialized():
            raise RuntimeError("this process is already in a torch.distributed group; a rank joins exactly one")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(0)  # Ray gives each rank its own GPU as device 0
        else:
            apply_cpu_patch()
        with _gloo_on_loopback() if master_addr in ("127.0.0.1", "localhost", "::1") else contextlib.nullcontext():
            dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{master_addr}:{master_port}",
                                    rank=rank, world_size=sizes.world, timeout=datetime.timedelta(seconds=timeout_s))
        _OWN_GROUP = True
        return _acquire_or_undo(sizes, seed)


def release() -> None:
    """One user fewer; the last one tears down what :func:`acquire` set up. Call it once per :func:`acquire`
    (``MegatronActor.close`` does, and may itself be called again)."""
    global _USERS
    with _LOCK:
        if _USERS == 0:
            return
        _USERS -= 1
        if _USERS == 0:
            _teardown_locked()


def _teardown_locked() -> None:
    """Tear down what this module set up itself (a launcher's process group is left alone); under ``_LOCK``."""
    global _OWN_GROUP, _OWN_MODEL_PARALLEL
    import torch.distributed as dist
    from megatron.core import parallel_state

    if _OWN_MODEL_PARALLEL:
        parallel_state.destroy_model_parallel()
        _OWN_MODEL_PARALLEL = False
    if _OWN_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_GROUP = False


def active_users() -> int:
    return _USERS
