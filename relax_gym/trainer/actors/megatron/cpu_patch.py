"""The one place where megatron-core 0.16.1 is made to run on a CPU-only torch.

megatron-core is written for CUDA; three things stop it on a CPU, each fixed here and nowhere else:

- ``torch.cuda.current_device()`` is used as the device of new tensors (the rotary frequencies, the attention's
  global memory buffer, dist_checkpointing's validation tensors). On a CPU build it raises; patched, it answers
  ``"cpu"`` so those tensors are made on the CPU.
- ``torch.cuda.synchronize()`` is called by ``dist_checkpointing`` around a save. There is no stream to wait for
  on a CPU: patched to do nothing.
- The model-parallel RNG tracker is normally seeded by ``model_parallel_cuda_manual_seed``, which sets CUDA RNG
  states. The inference flavour of the tracker needs no CUDA state (and dropout is off in the policy), so it is
  initialised instead (:func:`init_rng_tracker`).

:func:`apply_cpu_patch` changes nothing when CUDA is available, so a GPU run uses megatron-core unmodified. The
patch is process-wide and idempotent; it only replaces functions that would raise on a CPU-only build.
"""

from __future__ import annotations

import torch

__all__ = ["apply_cpu_patch", "cpu_patch_applied", "init_rng_tracker"]

_APPLIED = False


def _cpu_current_device() -> str:
    return "cpu"


def _no_synchronize(device=None) -> None:  # noqa: ARG001 - torch.cuda.synchronize's signature
    return None


def apply_cpu_patch() -> bool:
    """Patch ``torch.cuda`` for megatron-core when no GPU is usable; True if the patch is (now) in place."""
    global _APPLIED
    if torch.cuda.is_available():
        return False
    if not _APPLIED:
        torch.cuda.current_device = _cpu_current_device
        torch.cuda.synchronize = _no_synchronize
        _APPLIED = True
    return True


def cpu_patch_applied() -> bool:
    return _APPLIED


def init_rng_tracker() -> None:
    """The model-parallel RNG tracker without CUDA RNG states (CPU), after :func:`apply_cpu_patch`."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
