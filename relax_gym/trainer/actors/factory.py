"""The actor of the configured backend (``actor.backend``), for the colocate trainer and the async actor role.

    actor = build_actor(cfg, model, processor)   # HFActor, or MegatronActor (which converts ``model`` in place),
                                                 # or a RankGroup of RankActors (actor.parallel: one process per rank)

Both backends offer the same surface: ``set_lr``, ``forward_logprobs`` / ``logprobs``, ``rl_step``, ``sft_step``,
the streaming steps, ``state_dict`` / ``load_weights`` (HF names), ``hf_template`` / ``hf_model``,
``save_checkpoint``, ``close``. megatron-core is imported only when the megatron backend is asked for.

    critic = build_critic(cfg, actor.hf_model(), processor)   # algorithm.name=ppo: the value model (critic.py)

The critic is an HF model trained in plain torch whatever ``actor.backend`` is: it starts from the policy's HF
weights (``hf_model`` of either backend) and nothing else reads its weights.
"""

from __future__ import annotations

from typing import Any

from relax_gym.trainer.actors.critic import Critic
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.actors.settings import ActorRecipe

__all__ = ["build_actor", "build_critic"]


def build_actor(cfg: ActorRecipe, model: Any, processor: Any, *, group_name: str | None = None) -> HFActor:
    a = cfg.actor
    kwargs: dict[str, Any] = dict(lr=a.lr, betas=a.betas, weight_decay=a.weight_decay, grad_clip=a.grad_clip,
                                  micro_batch_size=a.micro_batch_size, routing_replay=cfg.algorithm.routing_replay)
    if a.backend == "hf":
        return HFActor(model, processor, **kwargs)
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"actor.backend=megatron needs megatron-core (pip install 'relax-gym[megatron]'): {exc}") from None
    from relax_gym.trainer.actors.megatron.runtime import ParallelSizes

    sizes = ParallelSizes.of(a.parallel)
    if a.parallel.world > 1 or a.parallel.launcher == "ray":  # one process per rank: a Ray rank group
        from relax_gym.trainer.actors.megatron.group import RankGroup, RankSpec

        routing_replay = kwargs.pop("routing_replay")
        spec = RankSpec(policy=cfg.model, sizes=sizes, optimizer=kwargs, routing_replay=routing_replay,
                        seed=cfg.trainer.seed, num_cpus_per_rank=a.parallel.num_cpus_per_rank,
                        num_gpus_per_rank=a.parallel.num_gpus_per_rank)
        return RankGroup(spec, model, processor, name=group_name)  # type: ignore[return-value]
    from relax_gym.trainer.actors.megatron.actor import MegatronActor

    return MegatronActor(model, processor, parallel=sizes, seed=cfg.trainer.seed, **kwargs)


def build_critic(cfg: ActorRecipe, backbone: Any, processor: Any) -> Critic:
    """The value model of ``algorithm.name=ppo`` on ``backbone`` (a copy of the policy it then owns), with the
    ``critic:`` section's optimiser."""
    c = cfg.critic
    return Critic(backbone, processor, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, grad_clip=c.grad_clip,
                  micro_batch_size=c.micro_batch_size, epochs=c.epochs)
