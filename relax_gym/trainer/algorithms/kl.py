"""Per-token KL estimators between the policy and a reference policy (Schulman, "Approximating KL Divergence").

With ``log_ratio = logprobs - ref_logprobs = log(pi / pi_ref)`` evaluated on tokens sampled from ``pi``, each
estimator's expectation is (approximately) ``KL(pi || pi_ref)``:

- ``k1 = log_ratio``: unbiased, high variance, can be negative per token.
- ``k2 = 0.5 * log_ratio**2``: biased (exact to second order), always >= 0, low variance.
- ``k3 = exp(-log_ratio) + log_ratio - 1 = exp(ref - lp) - (ref - lp) - 1``: unbiased *and* always >= 0 (since
  ``exp(x) >= 1 + x``), low variance; 0 exactly when the two log-probs are equal. Its gradient with respect to
  ``lp`` is ``1 - pi_ref / pi``. Computed with ``expm1`` for accuracy near equality.

Nothing is masked or reduced here: the result has the inputs' broadcast shape. Callers mask and aggregate.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLKind = Literal["k1", "k2", "k3"]

__all__ = ["KLKind", "kl_penalty"]


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind) -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)``; see the module docstring for the three kinds."""
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")
