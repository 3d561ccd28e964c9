"""Policy-optimisation math for the trainer: pure torch functions, no model or engine state.

- :mod:`.advantages`: GRPO / Dr.GRPO group-relative advantages, identical-reward groups (DAPO dynamic sampling).
- :mod:`.kl`: k1 / k2 / k3 per-token KL estimators.
- :mod:`.losses`: loss aggregation modes, the clipped policy loss (PPO/GRPO, DAPO clip-higher, GSPO sequence
  ratio, truncated importance sampling, KL term), SFT loss, per-token log-probs from logits.
- :mod:`.gae`: PPO with a critic: token-level GAE over a trajectory's trained tokens, advantage whitening, the
  clipped value loss, explained variance.
- :mod:`.config`: ``AlgorithmConfig`` and its presets (grpo, dapo, gspo, ppo, sft).
- :mod:`.registry`: the advantage estimators (``group``, ``gae``) and policy losses (``clipped``) by name; a new
  one is one decorated function.
"""

from relax_gym.trainer.algorithms.advantages import (
    AdvantageScale,
    group_advantages,
    identical_reward_groups,
    zero_advantage_share,
)
from relax_gym.trainer.algorithms.config import PRESETS, AlgorithmConfig, AlgorithmName, preset
from relax_gym.trainer.algorithms.gae import explained_variance, gae, gae_rows, next_token_mask, value_loss, whiten
from relax_gym.trainer.algorithms.kl import KLKind, kl_penalty
from relax_gym.trainer.algorithms.losses import (
    Aggregation,
    LossOutput,
    RatioLevel,
    aggregate,
    policy_loss,
    sft_loss,
    token_logprobs,
)
from relax_gym.trainer.algorithms.registry import (
    Advantages,
    StepBatch,
    advantage_estimator,
    estimator,
    policy_loss_function,
    policy_loss_of,
)

__all__ = [
    "PRESETS", "AdvantageScale", "Advantages", "Aggregation", "AlgorithmConfig", "AlgorithmName", "KLKind", "LossOutput",
    "RatioLevel", "StepBatch", "advantage_estimator", "aggregate", "estimator", "explained_variance", "gae", "gae_rows",
    "group_advantages", "identical_reward_groups", "kl_penalty", "next_token_mask", "policy_loss", "policy_loss_function",
    "policy_loss_of", "preset", "sft_loss", "token_logprobs", "value_loss", "whiten", "zero_advantage_share",
]
