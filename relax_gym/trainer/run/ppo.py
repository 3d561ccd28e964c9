"""One colocate update through the algorithm's registered estimator (:mod:`~relax_gym.trainer.algorithms.registry`),
and PPO's critic around it, as both trainer modes run it.

    values     = critic.values(items)                     # only for an estimator that needs a critic (ppo's gae)
    out        = estimator(algo.advantage_estimator).estimate(StepBatch(rewards, groups, loss_masks, values), algo)
    actor.rl_step(items, out.advantages, algo)             # the policy loss on per-sample or per-token advantages
    critic.train_step(items, out.returns, values, clip=algo.value_clip)  # the clipped value loss (critic only)

The colocate trainer runs these in order in one process (:func:`colocate_update`). The async engine runs them in
its roles on one step's partition of the data bus: the critic role writes ``values``, the advantages role calls
the same estimator (:func:`step_advantages` under PPO, on the whole partition: whitening needs the step's
statistics) and writes ``advantages`` and ``returns``, the actor role trains on those rows, and the critic role
then trains on them — so both modes compute the same advantages from the same values.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relax_gym.trainer.algorithms import AlgorithmConfig, StepBatch, estimator
from relax_gym.trainer.run.checkpoint import CRITIC_DIR, CheckpointError

if TYPE_CHECKING:  # the critic's code (transformers' model classes) loads where a critic is built, not in the
    # advantages role, which imports this module for step_advantages only
    from relax_gym.trainer.actors.critic import Critic

__all__ = ["colocate_update", "start_critic", "step_advantages"]


def step_advantages(loss_masks: Sequence[Sequence[int] | torch.Tensor], values: Sequence[torch.Tensor],
                    rewards: Sequence[float], algo: AlgorithmConfig) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token advantages and returns of one step's trained trajectories by the algorithm's critic estimator
    (ppo: GAE, :func:`~relax_gym.trainer.algorithms.gae.gae_estimator`): one row each, aligned with its values row."""
    out = estimator(algo.advantage_estimator).estimate(StepBatch(rewards, loss_masks=loss_masks, values=values), algo)
    return list(out.advantages), list(out.returns or [])


def start_critic(cfg: Any, actor: Any, processor: Any, checkpoint: Path | None = None) -> Critic:
    """The run's critic: the actor's current (warmed-up) policy copied under a zero value head, or, resuming, the
    critic saved in ``checkpoint`` (``checkpoint/critic``)."""
    from relax_gym.trainer.actors.factory import build_critic

    critic = build_critic(cfg, actor.hf_model(), processor)
    if checkpoint is not None:
        folder = Path(checkpoint) / CRITIC_DIR
        if not folder.is_dir():
            raise CheckpointError(f"{checkpoint}: no {CRITIC_DIR}/ folder; a run with algorithm.name=ppo cannot resume "
                                  "without its critic")
        critic.load(folder)
    return critic


def colocate_update(actor: Any, critic: Critic | None, items: Sequence[Any], algo: AlgorithmConfig, *,
                    ref_logprobs: list[torch.Tensor] | None = None, epochs: int = 1) -> dict[str, float]:
    """The colocate step's update on ``items`` (trajectories with a reward): the registered estimator's advantages
    (from the critic's values when it needs them), one actor update, and the critic's update when there is one;
    the actor's metrics and the critic's (``value_loss``, ``value_clip_frac``, ``explained_var``, ``values_mean``,
    ``returns_mean``, ``critic_grad_norm``)."""
    items = list(items)
    est = estimator(algo.advantage_estimator)
    if est.needs_critic and critic is None:
        raise ValueError(f"the {est.name!r} estimator needs a critic (algorithm {algo.name!r})")
    values = critic.values(items) if est.needs_critic else None
    out = est.estimate(StepBatch([it.reward for it in items], [it.group_id for it in items],
                                 [it.loss_mask for it in items] if values is not None else None, values), algo)
    metrics = actor.rl_step(items, out.advantages, algo, ref_logprobs=ref_logprobs, epochs=epochs)
    if values is not None:
        metrics.update(critic.train_step(items, out.returns, values, clip=algo.value_clip))
    return metrics
