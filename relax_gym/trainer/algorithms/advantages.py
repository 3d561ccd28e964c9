"""Group-relative advantages (GRPO family) and the group statistics around them.

Every function takes a flat batch of ``N`` samples: ``rewards`` (float, ``[N]``) and ``group_ids`` (long, ``[N]``),
where samples sharing an id are answers to the same prompt. Ids may be any integers, in any order, and groups may
have any sizes; everything is vectorised (``torch.unique`` + ``index_add_`` / ``scatter_reduce``), no Python loop
over groups.

Decisions:

- The group std is the *population* std (``unbiased=False``, divide by ``n``): it is defined for a one-sample
  group and for mixed group sizes it treats every group the same way. (TRL and verl call ``torch.std``, the
  unbiased ``n - 1`` form; for a group of ``n`` the two differ by the constant factor ``sqrt((n - 1) / n)``, so
  with equal group sizes the choice only rescales the advantages.)
- A group whose rewards are all equal (a one-sample group included) gets advantage exactly 0, also under
  ``scale="std"`` where floating-point round-off in ``r - mean`` would otherwise be amplified by ``1 / eps``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from relax_gym.trainer.algorithms.registry import Advantages, StepBatch, advantage_estimator

AdvantageScale = Literal["std", "none"]

__all__ = ["AdvantageScale", "group_advantages", "group_relative", "identical_reward_groups", "zero_advantage_share"]


def _groups(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Validate and map ids to dense group indices: (index per sample ``[N]``, size per group ``[G]``)."""
    if rewards.dim() != 1 or group_ids.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards and group_ids must be 1-D of equal length, got {tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    _, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return index, counts


def _group_extrema(values: Tensor, index: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    empty = values.new_zeros(n_groups)
    hi = empty.scatter_reduce(0, index, values, reduce="amax", include_self=False)
    lo = empty.scatter_reduce(0, index, values, reduce="amin", include_self=False)
    return hi, lo


def _identical(rewards: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """``[G]`` bool: the group's rewards are all equal (exact comparison)."""
    hi, lo = _group_extrema(rewards.detach(), index, n_groups)
    return hi == lo


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    scale: AdvantageScale = "std",
    eps: float = 1e-6,
    negative_scale: float = 1.0,
) -> Tensor:
    """Per-sample group-relative advantage.

    ``scale="std"`` (GRPO): ``(r - mean_g) / (std_g + eps)`` with ``std_g`` the population std of the group
    (``unbiased=False``). ``scale="none"`` (Dr.GRPO): ``r - mean_g``, no division, which removes the bias towards
    groups with a small reward spread. Groups with identical rewards get exactly 0.

    ``negative_scale`` multiplies the negative advantages only (1: unchanged; 0: learn from better-than-average
    samples alone, as reward-ranked fine-tuning does). Below 1 the estimate is biased towards imitation of the
    group's best samples, in exchange for a lower-variance step that does not push probability mass onto the
    other, unsampled answers.

    Statistics are computed in float64 and the result is returned in the rewards' dtype (the default float dtype
    for integer rewards).
    """
    if not 0.0 <= negative_scale <= 1.0:
        raise ValueError(f"negative_scale must be in [0, 1], got {negative_scale}")
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    index, counts = _groups(rewards, group_ids)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    x = rewards.to(torch.float64)
    n_groups = counts.numel()
    n = counts.to(torch.float64)
    mean = x.new_zeros(n_groups).index_add_(0, index, x) / n
    centred = x - mean[index]
    if scale == "std":
        var = x.new_zeros(n_groups).index_add_(0, index, centred.square()) / n
        centred = centred / (var.sqrt()[index] + eps)
    if negative_scale != 1.0:
        centred = torch.where(centred < 0, centred * negative_scale, centred)
    same = _identical(x, index, n_groups)[index]
    return torch.where(same, torch.zeros_like(centred), centred).to(out_dtype)


@advantage_estimator("group")
def group_relative(batch: StepBatch, algo: Any) -> Advantages:
    """The ``group`` estimator (GRPO, DAPO, GSPO): :func:`group_advantages` of the batch's rewards within their
    groups, scaled by ``algo.advantage_scale`` and ``algo.negative_advantage_scale``."""
    rewards = torch.tensor([float(r) for r in batch.rewards], dtype=torch.float32)
    groups = torch.tensor([int(g) for g in batch.group_ids], dtype=torch.long)
    return Advantages(group_advantages(rewards, groups, scale=algo.advantage_scale,
                                       negative_scale=algo.negative_advantage_scale))


def identical_reward_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``BoolTensor[N]``: True for samples whose group's rewards are all equal (exact equality).

    Such groups carry no learning signal under group-relative advantages; DAPO's dynamic sampling drops them.
    A one-sample group counts as identical.
    """
    index, counts = _groups(rewards, group_ids)
    return _identical(rewards, index, counts.numel())[index]


def zero_advantage_share(rewards: Tensor, group_ids: Tensor) -> float:
    """Share of *groups* (not samples) whose rewards are all equal, in [0, 1]; 0.0 for an empty batch.

    A share rising towards 1 means the policy answers every prompt the same way (all right or all wrong): a
    policy-collapse / saturation signal worth logging every step.
    """
    index, counts = _groups(rewards, group_ids)
    if counts.numel() == 0:
        return 0.0
    return _identical(rewards, index, counts.numel()).float().mean().item()
