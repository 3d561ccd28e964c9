"""PPO with a critic, on LLM trajectories: token-level GAE, advantage whitening, the clipped value loss.

Conventions (those of :mod:`.losses`): tensors are ``[B, T]`` over next-token positions (position ``t`` is the
prediction of token ``t + 1``, like the actor's log-probs) and ``mask`` marks the trained tokens (bool or 0/1).

A trajectory's *steps* are its trained tokens, in order. Prompt tokens and the env's replies between turns are
not steps: a multi-turn episode is one chain of its generated tokens, and the value of the last token of turn
``k`` bootstraps from the value of the first token of turn ``k + 1``. The episode's scalar reward arrives at its
last trained token and the chain ends there (the value after it is 0). With ``r_i`` that reward on the last
step and 0 elsewhere::

    delta_i = r_i + gamma * V_{i+1} - V_i          (V_n = 0 after the last step)
    A_i     = delta_i + gamma * lam * A_{i+1}      (A_n = 0)
    R_i     = A_i + V_i                            (the critic's regression target)

``gamma = lam = 1`` gives Monte-Carlo advantages ``A_i = r - V_i``; ``lam = 0`` gives one-step TD errors. The
recursion runs backwards over the chain, vectorised over the batch: rows are compacted so that each row's trained
tokens sit at the front in order (a stable sort of the mask), one loop over the longest chain, and the result is
scattered back to the original positions. Statistics are float64; results come back in the values' dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from relax_gym.trainer.algorithms.losses import LossOutput
from relax_gym.trainer.algorithms.registry import Advantages, StepBatch, advantage_estimator

__all__ = ["explained_variance", "gae", "gae_estimator", "gae_rows", "next_token_mask", "value_loss", "whiten"]


def _valid(mask: Tensor, like: Tensor, name: str) -> Tensor:
    if like.dim() != 2 or mask.shape != like.shape:
        raise ValueError(f"{name} and mask must be [B, T] of one shape, got {tuple(like.shape)} and {tuple(mask.shape)}")
    return mask != 0


def gae(values: Tensor, rewards: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, both ``[B, T]`` and 0 at masked positions, for ``values[B, T]`` (the critic's
    value of each position), one scalar reward per row (``rewards[B]``) and the trained-token ``mask``.

    A row without trained tokens gets zeros (its reward has no step to land on)."""
    valid = _valid(mask, values, "values")
    if rewards.dim() != 1 or rewards.shape[0] != values.shape[0]:
        raise ValueError(f"rewards must be [B] with B={values.shape[0]}, got {tuple(rewards.shape)}")
    if not 0.0 < gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"need 0 < gamma <= 1 and 0 <= lam <= 1, got gamma={gamma}, lam={lam}")
    out_dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
    b, t = values.shape
    # each row's trained positions first, in order (a stable sort puts the 0s -- valid -- before the 1s)
    order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices
    steps = valid.gather(1, order)
    v = torch.where(steps, values.detach().to(torch.float64).gather(1, order), 0.0)
    n = steps.sum(1)
    next_v = torch.cat([v[:, 1:], v.new_zeros(b, 1)], dim=1)  # 0 after the last step: the zeros past the chain
    r = v.new_zeros(b, t)
    rows = (n > 0).nonzero().squeeze(1)
    r[rows, n[rows] - 1] = rewards.detach().to(torch.float64)[rows]
    delta = torch.where(steps, r + gamma * next_v - v, 0.0)
    adv = torch.zeros_like(v)
    running = v.new_zeros(b)
    for i in range(t - 1, -1, -1):  # past a row's chain delta is 0, so running stays 0 until its last step
        running = delta[:, i] + gamma * lam * running
        adv[:, i] = running
    advantages = torch.zeros_like(adv).scatter(1, order, adv)
    returns = torch.where(valid, advantages + values.detach().to(torch.float64), 0.0)
    return advantages.to(out_dtype), returns.to(out_dtype)


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` over the valid positions of the whole batch (population std), 0 elsewhere.

    One valid position (or all equal) gives zeros: nothing to tell the tokens apart."""
    valid = _valid(mask, values, "values")
    x = values.detach().to(torch.float64)
    count = int(valid.sum())
    if count == 0:
        return torch.zeros_like(values)
    mean = x[valid].mean()
    std = x[valid].std(unbiased=False)
    out = torch.where(valid, (x - mean) / (std + eps), 0.0)
    return out.to(values.dtype)


def gae_rows(values: Sequence[Tensor], masks: Sequence[Tensor], rewards: Sequence[float] | Tensor, *, gamma: float,
             lam: float, whiten_advantages: bool) -> tuple[list[Tensor], list[Tensor]]:
    """:func:`gae` (and optionally :func:`whiten` over the whole batch) on ragged rows: ``values[i]`` and
    ``masks[i]`` are 1-D, one entry per next-token position of trajectory ``i``. Returns the advantage and
    return rows (float32, each as long as its values row). Both trainer modes call this on a step's trained
    trajectories, so they compute the same numbers."""
    if not (len(values) == len(masks) == len(rewards)):
        raise ValueError(f"one values row, mask row and reward per trajectory: got {len(values)}, {len(masks)}, {len(rewards)}")
    if not values:
        return [], []
    lengths = [int(v.numel()) for v in values]
    for i, (v, m) in enumerate(zip(values, masks)):
        if v.dim() != 1 or m.shape != v.shape:
            raise ValueError(f"row {i}: values and mask must be 1-D of one length, got {tuple(v.shape)} and {tuple(m.shape)}")
    width = max(lengths + [1])
    v = torch.zeros(len(values), width, dtype=torch.float64)
    m = torch.zeros(len(values), width, dtype=torch.bool)
    for i, (row, mrow) in enumerate(zip(values, masks)):
        v[i, : lengths[i]] = row.detach().to(torch.float64)
        m[i, : lengths[i]] = mrow != 0
    r = rewards.detach().to(torch.float64) if isinstance(rewards, Tensor) else torch.tensor(list(rewards), dtype=torch.float64)
    adv, ret = gae(v, r, m, gamma=gamma, lam=lam)
    if whiten_advantages:
        adv = whiten(adv, m)
    return ([adv[i, :n].float() for i, n in enumerate(lengths)], [ret[i, :n].float() for i, n in enumerate(lengths)])


def next_token_mask(loss_mask: Sequence[int] | Tensor) -> Tensor:
    """A trajectory's loss mask at its next-token positions (``loss_mask[1:]``, float32): the alignment of the
    actor's log-probs and the critic's values."""
    return torch.as_tensor(loss_mask, dtype=torch.float32).reshape(-1)[1:]


@advantage_estimator("gae", needs_critic=True)
def gae_estimator(batch: StepBatch, algo: Any) -> Advantages:
    """The ``gae`` estimator (PPO): per-token advantages and returns of a step's trained trajectories from the
    critic's values (GAE with ``algo.gamma`` / ``algo.lam``, whitened over all their trained tokens when
    ``algo.whiten_advantages``): one row each, aligned with its values row."""
    masks = []
    for i, (mask, row) in enumerate(zip(batch.loss_masks or [], batch.values or [])):
        m = next_token_mask(mask)
        if m.numel() != row.numel():
            raise ValueError(f"trajectory {i}: {row.numel()} values for {m.numel()} next-token positions")
        masks.append(m)
    adv, ret = gae_rows(list(batch.values or []), masks, [float(r) for r in batch.rewards], gamma=algo.gamma,
                        lam=algo.lam, whiten_advantages=algo.whiten_advantages)
    return Advantages(adv, ret)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the valid positions: 1 for a perfect critic, 0 for one that predicts the
    mean, negative for one worse than that; 0.0 when the returns do not vary (or nothing is valid)."""
    valid = _valid(mask, values, "values")
    if returns.shape != values.shape:
        raise ValueError(f"returns must have the values' shape {tuple(values.shape)}, got {tuple(returns.shape)}")
    if int(valid.sum()) == 0:
        return 0.0
    v = values.detach().to(torch.float64)[valid]
    r = returns.detach().to(torch.float64)[valid]
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return 0.0
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.2) -> LossOutput:
    """The clipped value loss of PPO (as in OpenAI's baselines and verl)::

        loss = 0.5 * token_mean( max((V - R)^2, (clip(V, V_old - clip, V_old + clip) - R)^2) )

    ``values`` carry the gradient; ``old_values`` (what the critic said when the advantages were computed) and
    ``returns`` are constants. ``clip=None`` drops the clipped branch. Masked positions never reach the loss or
    its gradient, even when they hold ``inf``/``NaN``; an all-masked batch gives a zero loss with a ``grad_fn``.

    Metrics: ``value_loss``, ``value_clip_frac`` (share of tokens where the clipped branch is the larger one, so
    the gradient is cut), ``explained_var`` (of ``values``), ``values_mean``, ``returns_mean``, ``tokens``.
    """
    valid = _valid(mask, values, "values")
    for name, t in (("old_values", old_values), ("returns", returns)):
        if t.shape != values.shape:
            raise ValueError(f"{name} must have the values' shape {tuple(values.shape)}, got {tuple(t.shape)}")
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")
    v = values.masked_fill(~valid, 0.0)
    old = old_values.detach().to(v.dtype).masked_fill(~valid, 0.0)
    ret = returns.detach().to(v.dtype).masked_fill(~valid, 0.0)
    plain = (v - ret).square()
    if clip is None:
        per_token, clipped_share = plain, v.new_zeros(v.shape, dtype=torch.bool)
    else:
        clipped = old + (v - old).clamp(-clip, clip)
        other = (clipped - ret).square()
        per_token = torch.maximum(plain, other)
        clipped_share = other > plain
    count = valid.sum().clamp(min=1)
    loss = 0.5 * per_token.masked_fill(~valid, 0.0).sum() / count
    n = int(valid.sum())
    with torch.no_grad():
        metrics = {
            "value_loss": float(loss.detach()),
            "value_clip_frac": float((clipped_share & valid).sum()) / n if n else 0.0,
            "explained_var": explained_variance(v, ret, valid),
            "values_mean": float(v.detach().sum()) / n if n else 0.0,
            "returns_mean": float(ret.sum()) / n if n else 0.0,
            "tokens": float(n),
        }
    return LossOutput(loss=loss, metrics=metrics)
