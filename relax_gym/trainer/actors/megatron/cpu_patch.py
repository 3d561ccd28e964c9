"""The one place where megatron-core 0.16.1 is made to run on a CPU-only torch.

megatron-core is written for CUDA; these things stop it on a CPU, each fixed here and nowhere else:

- ``torch.cuda.current_device()`` is used as the device of new tensors (the rotary frequencies, the attention's
  global memory buffer, dist_checkpointing's validation tensors). On a CPU build it raises; patched, it answers
  ``"cpu"`` so those tensors are made on the CPU.
- ``torch.cuda.synchronize()`` is called by ``dist_checkpointing`` around a save. There is no stream to wait for
  on a CPU: patched to do nothing.
- The model-parallel RNG tracker is normally seeded by ``model_parallel_cuda_manual_seed``, which sets CUDA RNG
  states. The inference flavour of the tracker needs no CUDA state (and dropout is off in the policy), so it is
  initialised instead (:func:`init_rng_tracker`).
- The pipeline schedules make one counter tensor with ``device="cuda"`` written out; their module's ``torch`` is
  swapped for a view of torch that makes that tensor on the CPU (:class:`_SchedulesTorch`; nothing else changes);
  and with tied embeddings the last stage's copy of the table is moved with ``.cuda()`` while the model is built
  (:func:`_tensors_stay_on_cpu`, around that one method).

:func:`apply_cpu_patch` changes nothing when CUDA is available, so a GPU run uses megatron-core unmodified. The
patch is process-wide and idempotent; it only replaces functions that would raise on a CPU-only build.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["apply_cpu_patch", "cpu_patch_applied", "init_rng_tracker"]

_APPLIED = False


def _cpu_current_device() -> str:
    return "cpu"


def _no_synchronize(device=None) -> None:  # noqa: ARG001 - torch.cuda.synchronize's signature
    return None


class _SchedulesTorch(types.ModuleType):
    """``torch`` as megatron-core's pipeline schedules see it on a CPU: the same module, except that the token
    counter they make with ``device="cuda"`` (hard-coded, not ``current_device()``) is made on the CPU."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: object, device: object = None, **kwargs: object) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)  # type: ignore[call-overload]


def _tensors_stay_on_cpu(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with ``Tensor.cuda()`` answering the tensor itself while it runs (the tied embedding's copy on
    the last pipeline stage is moved with ``.cuda()`` before the stages sum it)."""

    @functools.wraps(method)
    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda tensor, *a, **k: tensor  # type: ignore[method-assign]
        try:
            return method(*args, **kwargs)
        finally:
            torch.Tensor.cuda = cuda  # type: ignore[method-assign]

    return on_cpu


def apply_cpu_patch() -> bool:
    """Patch ``torch.cuda`` for megatron-core when no GPU is usable; True if the patch is (now) in place."""
    global _APPLIED
    if torch.cuda.is_available():
        return False
    if not _APPLIED:
        torch.cuda.current_device = _cpu_current_device
        torch.cuda.synchronize = _no_synchronize
        from megatron.core.models.common.language_module.language_module import LanguageModule
        from megatron.core.pipeline_parallel import schedules

        schedules.torch = _SchedulesTorch("torch")
        LanguageModule.setup_embeddings_and_output_layer = _tensors_stay_on_cpu(
            LanguageModule.setup_embeddings_and_output_layer)
        _APPLIED = True
    return True


def cpu_patch_applied() -> bool:
    return _APPLIED


def init_rng_tracker() -> None:
    """The model-parallel RNG tracker without CUDA RNG states (CPU), after :func:`apply_cpu_patch`."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
