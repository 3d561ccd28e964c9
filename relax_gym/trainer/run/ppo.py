"""PPO's step around the critic (``algorithm.name: ppo``), as both trainer modes run it.

    values     = critic.values(items)                            # the critic's value of every trained token
    adv, ret   = step_advantages(loss_masks, values, rewards, algo)   # GAE over each episode's trained tokens
    actor.rl_step(items, adv, algo)                              # the clipped surrogate on per-token advantages
    critic.train_step(items, ret, values, clip=algo.value_clip)  # the clipped value loss towards the returns

The colocate trainer runs these four in order in one process (:func:`colocate_ppo_step`). The async engine runs
them in its roles on one step's partition of the data bus: the critic role writes ``values``, the advantages role
calls :func:`step_advantages` on the whole partition (whitening needs the step's statistics) and writes
``advantages`` and ``returns``, the actor role trains on those rows, and the critic role then trains on them — so
both modes compute the same advantages from the same values.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from relax_gym.trainer.actors.critic import Critic
from relax_gym.trainer.actors.factory import build_critic
from relax_gym.trainer.algorithms import AlgorithmConfig, gae_rows
from relax_gym.trainer.run.checkpoint import CRITIC_DIR, CheckpointError

__all__ = ["colocate_ppo_step", "next_token_mask", "start_critic", "step_advantages"]


def next_token_mask(loss_mask: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """A trajectory's loss mask at its next-token positions (``loss_mask[1:]``, float32): the alignment of the
    actor's log-probs and the critic's values."""
    return torch.as_tensor(loss_mask, dtype=torch.float32).reshape(-1)[1:]


def step_advantages(loss_masks: Sequence[Sequence[int] | torch.Tensor], values: Sequence[torch.Tensor],
                    rewards: Sequence[float], algo: AlgorithmConfig) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token advantages and returns of one step's trained trajectories (GAE with ``algo.gamma`` / ``algo.lam``,
    whitened over all their trained tokens when ``algo.whiten_advantages``): one row each, aligned with its
    values row."""
    masks = []
    for i, (mask, row) in enumerate(zip(loss_masks, values)):
        m = next_token_mask(mask)
        if m.numel() != row.numel():
            raise ValueError(f"trajectory {i}: {row.numel()} values for {m.numel()} next-token positions")
        masks.append(m)
    return gae_rows(list(values), masks, [float(r) for r in rewards], gamma=algo.gamma, lam=algo.lam,
                    whiten_advantages=algo.whiten_advantages)


def start_critic(cfg: Any, actor: Any, processor: Any, checkpoint: Path | None = None) -> Critic:
    """The run's critic: the actor's current (warmed-up) policy copied under a zero value head, or, resuming, the
    critic saved in ``checkpoint`` (``checkpoint/critic``)."""
    critic = build_critic(cfg, actor.hf_model(), processor)
    if checkpoint is not None:
        folder = Path(checkpoint) / CRITIC_DIR
        if not folder.is_dir():
            raise CheckpointError(f"{checkpoint}: no {CRITIC_DIR}/ folder; a run with algorithm.name=ppo cannot resume "
                                  "without its critic")
        critic.load(folder)
    return critic


def colocate_ppo_step(actor: Any, critic: Critic, items: Sequence[Any], algo: AlgorithmConfig, *,
                      ref_logprobs: list[torch.Tensor] | None = None, epochs: int = 1) -> dict[str, float]:
    """Values, advantages, one actor update, one critic update on ``items`` (trajectories with a reward); the
    actor's metrics and the critic's (``value_loss``, ``value_clip_frac``, ``explained_var``, ``values_mean``,
    ``returns_mean``, ``critic_grad_norm``)."""
    items = list(items)
    values = critic.values(items)
    advantages, returns = step_advantages([it.loss_mask for it in items], values, [it.reward for it in items], algo)
    metrics = actor.rl_step(items, advantages, algo, ref_logprobs=ref_logprobs, epochs=epochs)
    metrics.update(critic.train_step(items, returns, values, clip=algo.value_clip))
    return metrics
