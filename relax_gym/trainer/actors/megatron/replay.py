"""Routing replay (R3) on megatron-core's MoE routers, through megatron-core's own ``RouterReplay`` hook.

With ``moe_enable_routing_replay`` (set by :func:`~relax_gym.trainer.actors.megatron.moe.moe_config_fields`) every
``TopKRouter`` holds a ``RouterReplay`` that ``topk_routing_with_score_function`` asks for the top-k: with no action
set it computes the top-k itself; ``RECORD`` computes and keeps it; ``REPLAY_FORWARD`` takes a given
``(tokens, k)`` index tensor and gathers the router's scores at those experts (with Qwen3's routing, the top-k logits
then a softmax over them: the forced experts' weights are this forward's router probabilities renormalised, as the
hf backend's :func:`~relax_gym.trainer.policy.routers.replay_routing` does, and the router still gets gradients).

The stock ``REPLAY_FORWARD`` forces every token; a training batch also holds tokens without a record (-1: the
prompt padding, the episode's last token) that must route freely, and the mismatch metric needs the router's own
choice of every token. :class:`TokenReplay` (a ``RouterReplay``) does both: it computes the router's own top-k,
keeps it, and replaces it by the record on the rows that have one. :func:`replay_routing` swaps it in for the stock
hook of each router (once; it also leaves megatron-core's process-wide list of hooks, which would otherwise grow
with every model built in the process), arms it for one forward and yields the
:class:`~relax_gym.trainer.policy.routers.RoutingTrace` (natural / used / forced, per layer ``(B, T, K)``) that
:class:`~relax_gym.trainer.policy.routing.RoutingCounts` counts.

Megatron's routers see the hidden states as ``(T, B, H)``, so a router's rows are token-major (row ``t * B + b``);
records ``(B, T, layers, K)`` are transposed to that order and traces back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from relax_gym.trainer.policy.routers import RoutingTrace

__all__ = ["TokenReplay", "megatron_routers", "replay_routing", "routing_shape"]


def megatron_routers(model: nn.Module) -> list[nn.Module]:
    """The ``TopKRouter`` of every MoE layer of a Megatron thinker's decoder, in layer order (empty when dense)."""
    from megatron.core.transformer.moe.router import TopKRouter

    from relax_gym.trainer.actors.megatron.model import gpt_of

    return [m.mlp.router for m in gpt_of(model).decoder.layers if isinstance(getattr(m.mlp, "router", None), TopKRouter)]


def routing_shape(model: nn.Module) -> tuple[int, int] | None:
    """``(MoE layers, experts per token)`` of a Megatron thinker; None when it has no MoE layer."""
    routers = megatron_routers(model)
    return (len(routers), int(routers[0].topk)) if routers else None


def _base_class() -> type:
    from megatron.core.transformer.moe.router_replay import RouterReplay

    return RouterReplay


class TokenReplay(_base_class()):  # type: ignore[misc]
    """A per-router ``RouterReplay`` that replays a record row by row (rows of -1 route freely) and keeps the router's
    own top-k of every row (``natural``) and the experts it used (``used``). Not in megatron-core's global list."""

    def __init__(self) -> None:  # RouterReplay.__init__ would register the instance process-wide
        self.target_topk_idx = None
        self.recorded_topk_idx = None
        self.router_replay_action = None
        self.replay_backward_list = []
        self.used: torch.Tensor | None = None
        self.forced: torch.Tensor | None = None

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: int | None = None,
                        group_topk: int | None = None, default_compute_topk: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        if self.router_replay_action != RouterReplayAction.REPLAY_FORWARD:
            out = super().get_replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)
            if self.router_replay_action == RouterReplayAction.RECORD:
                self.used = out[1].detach()
                self.forced = torch.zeros(out[1].shape[0], dtype=torch.bool, device=out[1].device)
            return out
        values, natural = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        self.record_indices(natural.detach())
        target = self.target_topk_idx.to(scores.device)
        forced = (target >= 0).all(dim=-1)
        used = torch.where(forced[:, None], target.clamp_min(0), natural)
        self.used, self.forced = used.detach(), forced
        return scores.gather(1, used), used


def _token_replay(router: nn.Module) -> TokenReplay:
    """The router's :class:`TokenReplay`, swapped in for megatron-core's stock hook on first use."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    hook = router.router_replay
    if isinstance(hook, TokenReplay):
        return hook
    if hook is None:
        raise ValueError("this Megatron model was built without moe_enable_routing_replay: its routers cannot replay")
    instances = RouterReplay.global_router_replay_instances
    if any(x is hook for x in instances):
        instances[:] = [x for x in instances if x is not hook]
    router.router_replay = TokenReplay()
    return router.router_replay


@contextmanager
def replay_routing(model: nn.Module, recorded: torch.Tensor | None, *, batch: int) -> Iterator[RoutingTrace]:
    """For one forward inside the block: route with ``recorded`` (``(B, T, layers, K)``, -1 = no record; None =
    route freely and only trace); yields the :class:`RoutingTrace` (filled when the block ends)."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    routers = megatron_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no Megatron MoE layers: there is no routing to replay")
    top_k = int(routers[0].topk)
    if recorded is not None and (recorded.dim() != 4 or recorded.shape[0] != batch
                                 or recorded.shape[2] != len(routers) or recorded.shape[3] != top_k):
        raise ValueError(f"recorded routing of shape {list(recorded.shape)} does not fit (batch {batch}, tokens, "
                         f"{len(routers)} MoE layers, top-{top_k})")
    hooks = [_token_replay(r) for r in routers]
    trace = RoutingTrace()
    try:
        for layer, hook in enumerate(hooks):
            hook.clear_indices()
            hook.used = hook.forced = None
            if recorded is None:
                hook.set_router_replay_action(RouterReplayAction.RECORD)
            else:
                rows = recorded[:, :, layer].transpose(0, 1).reshape(-1, top_k)  # token-major, as the router sees them
                hook.target_topk_idx = rows.to(device=routers[layer].weight.device, dtype=torch.long)
                hook.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        yield trace
        for hook in hooks:
            if hook.used is None:
                raise RuntimeError("a Megatron MoE router was not called in the replayed forward")

            def batch_major(rows: torch.Tensor) -> torch.Tensor:
                return rows.view(-1, batch, *rows.shape[1:]).transpose(0, 1)

            trace.natural.append(batch_major(hook.get_recorded_indices()))
            trace.used.append(batch_major(hook.used))
            trace.forced.append(batch_major(hook.forced))
    finally:
        for hook in hooks:
            hook.clear_router_replay_action()
            hook.clear_indices()
            hook.used = hook.forced = None
