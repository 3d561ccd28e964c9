"""megatron-core's process state for one trainer process: the default process group and the model-parallel groups.

megatron-core keeps its parallel layout in module globals (``megatron.core.parallel_state``), so it is set up once
per process and shared by every Megatron model made in it. :func:`acquire` sets it up the first time (and counts
its users), :func:`release` tears it down when the last user is done -- only what it set up itself: a process
group that a launcher (``torchrun``) made is left alone.

The trainer runs its actor in one process, so the group it makes has world size 1: gloo over loopback on a CPU
(an in-process store, nothing listens on a port; gloo's device bound to the loopback interface), nccl on a GPU.
Tensor / pipeline / context parallel sizes above 1 need as many processes as their product, started by a
launcher; asking for them in a single process is one clear error.
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

    @property
    def world(self) -> int:
        return self.tensor * self.pipeline * self.context


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
                f"tensor x pipeline x context parallel = {sizes.tensor} x {sizes.pipeline} x {sizes.context} needs "
                f"{sizes.world} processes started by a launcher (torchrun); this trainer runs its actor in one process")
        if cuda:
            torch.cuda.set_device(0)
        with _gloo_on_loopback():
            dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        _OWN_GROUP = True
    elif dist.get_world_size() % sizes.world:
        raise ValueError(f"world size {dist.get_world_size()} is not a multiple of tensor x pipeline x context "
                         f"parallel = {sizes.world}")
    if not parallel_state.model_parallel_is_initialized():
        with _gloo_on_loopback():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=sizes.tensor, pipeline_model_parallel_size=sizes.pipeline,
                context_parallel_size=sizes.context)
        _OWN_MODEL_PARALLEL = True
    else:
        have = ParallelSizes(parallel_state.get_tensor_model_parallel_world_size(),
                             parallel_state.get_pipeline_model_parallel_world_size(),
                             parallel_state.get_context_parallel_world_size())
        if have != sizes:
            raise ValueError(f"megatron-core is already set up in this process with {have}, not {sizes}")
    if cuda:
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
    else:
        init_rng_tracker()
    _USERS += 1
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


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
