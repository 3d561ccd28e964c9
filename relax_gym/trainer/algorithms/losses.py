"""Policy-optimisation losses on ``[B, T]`` token tensors: PPO/GRPO/DAPO/GSPO clipped surrogate, SFT, log-probs.

Conventions shared by every function here:

- ``mask`` is ``[B, T]``, bool or 0/1 numbers; a position is valid when ``mask != 0``. Masked positions never
  reach the loss, its gradient or the metrics, even when their inputs are ``inf``/``NaN`` (inputs are replaced
  before any arithmetic, so no ``0 * inf`` can leak a NaN into the gradient).
- An all-masked batch gives a finite zero loss that still has a ``grad_fn`` (zero gradients), so a rank whose
  micro-batch is all padding can take part in a collective backward.
- ``old_logprobs``, ``ref_logprobs``, ``rollout_logprobs`` and ``advantages`` are treated as constants (detached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from relax_gym.trainer.algorithms.kl import KLKind, kl_penalty
from relax_gym.trainer.algorithms.registry import policy_loss_function

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
RatioLevel = Literal["token", "sequence"]

__all__ = ["Aggregation", "LossOutput", "RatioLevel", "aggregate", "policy_loss", "sft_loss", "token_logprobs"]

_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
# Low-precision logits are upcast to float32 this many elements at a time in token_logprobs (256 MiB).
_UPCAST_BUDGET = 1 << 26


@dataclass
class LossOutput:
    """A scalar loss to call ``backward`` on, and detached float metrics for logging."""

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def _valid(mask: Tensor, like: Tensor, name: str = "mask") -> Tensor:
    if mask.shape != like.shape or like.dim() != 2:
        raise ValueError(f"{name} must be [B, T] and match the values, got {tuple(mask.shape)} vs {tuple(like.shape)}")
    return mask != 0


def aggregate(values: Tensor, mask: Tensor, mode: Aggregation = "token_mean") -> Tensor:
    """Reduce per-token ``values[B, T]`` over the valid positions of ``mask`` to a scalar.

    - ``token_mean`` (DAPO token-level): ``sum(values * mask) / sum(mask)``; every valid token weighs the same, so
      long sequences weigh more.
    - ``seq_mean_token_mean`` (original GRPO): mean over each sequence's valid tokens, then mean over sequences.
    - ``seq_mean_token_sum`` (Dr.GRPO): sum over each sequence's valid tokens, then mean over sequences. Dr.GRPO
      also divides by a fixed generation budget; that is a constant factor, left to the learning rate.

    Sequence means are taken over sequences with at least one valid token (an all-padding row does not dilute
    the loss). All-zero mask → ``0`` (with a ``grad_fn`` when ``values`` requires grad), never NaN.
    """
    valid = _valid(mask, values)
    v = values.masked_fill(~valid, 0.0)
    if mode == "token_mean":
        return v.sum() / valid.sum().clamp(min=1)
    if mode not in _AGGREGATIONS:
        raise ValueError(f"mode must be one of {_AGGREGATIONS}, got {mode!r}")
    tokens = valid.sum(-1)
    per_seq = v.sum(-1)
    if mode == "seq_mean_token_mean":
        per_seq = per_seq / tokens.clamp(min=1)
    return per_seq.sum() / (tokens > 0).sum().clamp(min=1)


def _token_mean(values: Tensor, valid: Tensor) -> float:
    n = int(valid.sum())
    return float(values.detach().masked_fill(~valid, 0.0).sum()) / n if n else 0.0


@policy_loss_function("clipped")
def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_level: RatioLevel = "token",
    aggregation: Aggregation = "token_mean",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
    rollout_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
) -> LossOutput:
    """Clipped-surrogate policy loss, per token, then aggregated.

    Per valid token ``t`` of sequence ``i`` with advantage ``A`` (``advantages`` is ``[B]``, broadcast over the
    sequence, or ``[B, T]``)::

        pg   = -min(s * A, clip(s, 1 - clip_low, 1 + clip_high) * A)
        loss = w * pg + kl_coef * kl_penalty(logprobs, ref_logprobs, kl_kind)

    - ``ratio_level="token"`` (PPO/GRPO/DAPO): ``s = exp(lp - old_lp)``. ``clip_high > clip_low`` is DAPO's
      clip-higher.
    - ``ratio_level="sequence"`` (GSPO): the length-normalised sequence ratio
      ``s_i = exp(mean over valid tokens of (lp - old_lp))`` in GSPO-token form
      ``s_i,t = sg[s_i] * exp(lp_t - sg[lp_t])``: every token of a sequence has the value ``s_i`` (so they are
      clipped together) and ``d s_i,t / d lp_t = s_i``. With ``seq_mean_token_mean`` aggregation this gives
      exactly GSPO's sequence gradient ``s_i * A_i * mean_t grad lp_t``.
    - Truncated importance sampling: when ``rollout_logprobs`` (the behaviour policy that generated the tokens,
      which lags ``old_logprobs`` under asynchronous/stale rollouts or differs through engine numerics) is given,
      ``w = min(exp(old_lp - rollout_lp), tis_cap)``, detached; ``tis_cap=None`` leaves it untruncated. Without
      ``rollout_logprobs``, ``w = 1``. ``w`` weights the policy-gradient term only, not the KL regulariser.
    - The KL term needs ``ref_logprobs``; with ``ref_logprobs`` and ``kl_coef == 0`` the KL is only reported.

    Metrics (token means over valid tokens): ``clip_frac_low`` / ``clip_frac_high`` (share of tokens where the
    clip binds and zeroes the gradient: ``s < 1 - clip_low`` with ``A < 0``, ``s > 1 + clip_high`` with
    ``A > 0``), ``ratio_mean``, ``approx_kl`` (k3 estimate of ``KL(pi_old || pi)``, from the token ratios),
    ``pg_loss`` (aggregated like the loss), ``tokens``; with a reference ``kl_ref`` (and the term's share of
    the loss in ``kl_loss``); with rollout log-probs ``is_weight_mean`` and ``is_capped_share``.
    """
    valid = _valid(mask, logprobs)
    for name, t in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs), ("rollout_logprobs", rollout_logprobs)):
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(logprobs.shape)}, got {tuple(t.shape)}")
    if not 0 <= clip_low < 1 or clip_high < 0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0 or None, got {tis_cap}")
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")

    adv = advantages.detach().to(logprobs.dtype)
    if adv.dim() == 1 and adv.shape[0] == logprobs.shape[0]:
        adv = adv.unsqueeze(-1).expand_as(logprobs)
    elif adv.shape != logprobs.shape:
        raise ValueError(f"advantages must be [B] or [B, T] for logprobs {tuple(logprobs.shape)}, got {tuple(adv.shape)}")
    adv = adv.masked_fill(~valid, 0.0)

    lp = logprobs.masked_fill(~valid, 0.0)
    old = old_logprobs.detach().masked_fill(~valid, 0.0)
    log_ratio = lp - old
    if ratio_level == "token":
        ratio = torch.exp(log_ratio)
    else:
        tokens = valid.sum(-1, keepdim=True).clamp(min=1)
        seq_log_ratio = (log_ratio.detach().sum(-1, keepdim=True) / tokens).expand_as(lp)
        ratio = torch.exp(seq_log_ratio + lp - lp.detach())
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)

    metrics: dict[str, float] = {}
    if rollout_logprobs is not None:
        w = torch.exp(old - rollout_logprobs.detach().masked_fill(~valid, 0.0))
        capped = valid & (w > tis_cap) if tis_cap is not None else torch.zeros_like(valid)
        if tis_cap is not None:
            w = w.clamp(max=tis_cap)
        pg = pg * w
        metrics["is_weight_mean"] = _token_mean(w, valid)
        metrics["is_capped_share"] = _token_mean(capped.to(w.dtype), valid)

    per_token = pg
    if ref_logprobs is not None:
        kl = kl_penalty(lp, ref_logprobs.detach().masked_fill(~valid, 0.0), kl_kind)
        metrics["kl_ref"] = _token_mean(kl, valid)
        if kl_coef > 0:
            per_token = pg + kl_coef * kl
            metrics["kl_loss"] = float(aggregate(kl_coef * kl.detach(), valid, aggregation))

    loss = aggregate(per_token, valid, aggregation)
    with torch.no_grad():
        r = ratio.detach()
        metrics["pg_loss"] = float(aggregate(pg.detach(), valid, aggregation))
        metrics["clip_frac_low"] = _token_mean(((r < 1.0 - clip_low) & (adv < 0)).to(r.dtype), valid)
        metrics["clip_frac_high"] = _token_mean(((r > 1.0 + clip_high) & (adv > 0)).to(r.dtype), valid)
        metrics["ratio_mean"] = _token_mean(r, valid)
        metrics["approx_kl"] = _token_mean(kl_penalty(old, lp.detach(), "k3"), valid)
        metrics["tokens"] = float(valid.sum())
    return LossOutput(loss=loss, metrics=metrics)


def sft_loss(logprobs: Tensor, mask: Tensor, aggregation: Aggregation = "token_mean") -> LossOutput:
    """Negative log-likelihood of the valid tokens, aggregated like the policy loss.

    Metrics: ``nll`` (token mean, whatever the aggregation), ``ppl`` (``exp(nll)``), ``tokens``.
    """
    valid = _valid(mask, logprobs)
    nll = -logprobs.masked_fill(~valid, 0.0)
    loss = aggregate(nll, valid, aggregation)
    token_nll = _token_mean(nll, valid)
    return LossOutput(loss=loss, metrics={"nll": token_nll, "ppl": math.exp(min(token_nll, 700.0)), "tokens": float(valid.sum())})


def _gathered_logprobs(logits: Tensor, target_ids: Tensor, temperature: float) -> Tensor:
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_logprobs(logits: Tensor, target_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[..., target_id]`` per position: ``[..., V], [...] -> [...]``.

    Use the sampler's temperature so the log-probs are those of the distribution the tokens were drawn from.
    Computed as ``logit[target] - logsumexp(logits)`` without materialising the ``[..., V]`` log-softmax. The
    result is float32 (float64 for float64 logits); float16/bfloat16 logits are upcast to float32 a chunk of
    rows at a time, so the float32 copy never exceeds ~256 MiB. ``target_ids`` must be valid vocabulary ids
    (put any id, e.g. 0, at padding positions and mask them later): ``-100`` style ignore ids are an error.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != target_ids.shape:
        raise ValueError(f"target_ids {tuple(target_ids.shape)} must match logits {tuple(logits.shape)} without the vocab dim")
    target_ids = target_ids.long()
    if logits.dtype in (torch.float32, torch.float64):
        return _gathered_logprobs(logits, target_ids, temperature)
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_ids = target_ids.reshape(-1)
    rows = max(1, _UPCAST_BUDGET // max(vocab, 1))
    chunks = [
        _gathered_logprobs(flat_logits[i : i + rows].float(), flat_ids[i : i + rows], temperature)
        for i in range(0, flat_logits.shape[0], rows)
    ]
    out = torch.cat(chunks) if chunks else flat_logits.new_zeros(0, dtype=torch.float32)
    return out.reshape(target_ids.shape)
