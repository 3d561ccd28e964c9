"""The MoE routers of a policy: find them, record the experts they pick, force the experts they must pick.

A router here is the module a sparse MoE block calls as ``logits, weights, experts = gate(hidden)`` on the
flattened ``(batch * tokens, hidden)`` states: softmax over the router logits, the top-k experts, their
probabilities renormalised when ``norm_topk_prob`` (Qwen3-Omni MoE, Qwen3-MoE and Qwen2-MoE in transformers all
route this way). :func:`moe_routers` lists a model's routers in layer order.

- :class:`RoutingRecorder` (rollout): forward hooks on every router collect the expert ids of each forward call
  (a prefill, then one decode step per token); :meth:`RoutingRecorder.rows` cuts out each row's tokens.
- :func:`replay_routing` (training): a context manager that, for one forward, replaces each router's ``forward``
  on the instance (nothing global; restored on exit, also on error). Tokens with recorded experts use them; the
  weights are recomputed for those experts from this forward's router logits as the family does (softmax over the
  logits, gathered at the forced ids, renormalised), so the router still gets gradients. Tokens without a record
  (id -1) route freely. Either way the experts the router would have picked itself are kept, to measure mismatch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["RoutingRecorder", "RoutingTrace", "moe_routers", "replay_routing", "routing_shape"]


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The top-k routers of the text decoder's MoE layers, in layer order (empty for a dense model)."""
    text = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(text, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers found (model.get_decoder().layers)")
    routers = []
    for layer in layers:
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and all(hasattr(gate, a) for a in ("top_k", "num_experts", "weight")):
            routers.append(gate)
    return routers


def routing_shape(model: nn.Module) -> tuple[int, int]:
    """``(MoE layers, experts per token)`` of ``model``; an error for a dense model."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no MoE layers: there is no routing to record or replay")
    return len(routers), int(routers[0].top_k)


class RoutingRecorder:
    """Records the expert ids every router picks while active (``with recorder:``), per forward call.

    ``batch`` is the number of rows of the forwards (the router sees ``batch * tokens`` flattened rows)."""

    def __init__(self, model: nn.Module, batch: int) -> None:
        self.routers = moe_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no MoE layers: nothing to record")
        self.batch = int(batch)
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.routers]  # per layer, per forward: (B, T, K)
        self._handles: list[Any] = []

    def __enter__(self) -> RoutingRecorder:
        for layer, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, layer: int):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            ids = output[2]
            self.calls[layer].append(ids.detach().to("cpu", torch.int16).view(self.batch, -1, ids.shape[-1]))
        return hook

    def spread(self, index: torch.Tensor) -> None:
        """Replace the forwards recorded so far (run on distinct prompts) by their rows ``index`` (one per batch row):
        the engine's shared prefill copies KV-cache rows the same way."""
        idx = index.to("cpu")
        self.calls = [[call[idx] for call in calls] for calls in self.calls]

    def tokens(self) -> torch.Tensor:
        """All recorded positions: ``(B, T, layers, K)`` int16, forwards concatenated along T."""
        per_layer = [torch.cat(calls, dim=1) for calls in self.calls]
        return torch.stack(per_layer, dim=2)

    def rows(self, starts: Sequence[int], lengths: Sequence[int]) -> list[torch.Tensor]:
        """Row ``b``'s positions ``starts[b] : starts[b] + lengths[b]`` as ``(lengths[b], layers, K)`` int16."""
        all_ids = self.tokens()
        out = []
        for b, (start, n) in enumerate(zip(starts, lengths)):
            if start < 0 or start + n > all_ids.shape[1]:
                raise ValueError(f"row {b}: positions {start}..{start + n} outside the {all_ids.shape[1]} recorded")
            out.append(all_ids[b, start : start + n].clone())
        return out


@dataclass
class RoutingTrace:
    """What one replayed forward routed: per MoE layer, the experts the router would pick (``natural``) and the
    experts it used (``used``), both ``(B, T, K)``; ``forced`` True where a recorded choice was applied."""

    natural: list[torch.Tensor] = field(default_factory=list)
    used: list[torch.Tensor] = field(default_factory=list)
    forced: list[torch.Tensor] = field(default_factory=list)


def _forced_forward(router: nn.Module, recorded: torch.Tensor | None, trace: RoutingTrace, batch: int):
    """A router ``forward`` whose top-k is ``recorded`` ((B*T, K), -1 rows route freely)."""

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden_states = hidden_states.reshape(-1, router.weight.shape[1])
        logits = nn.functional.linear(hidden_states, router.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        natural = torch.topk(probs, router.top_k, dim=-1).indices
        if recorded is None:
            experts, forced = natural, torch.zeros(natural.shape[0], dtype=torch.bool, device=natural.device)
        else:
            forced = (recorded >= 0).all(dim=-1)
            experts = torch.where(forced.unsqueeze(-1), recorded.clamp_min(0), natural)
        weights = probs.gather(1, experts)
        if getattr(router, "norm_topk_prob", True):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        trace.natural.append(natural.detach().view(batch, -1, router.top_k))
        trace.used.append(experts.detach().view(batch, -1, router.top_k))
        trace.forced.append(forced.view(batch, -1))
        return logits, weights.to(logits.dtype), experts

    return forward


@contextmanager
def replay_routing(model: nn.Module, recorded: torch.Tensor | None, *, batch: int) -> Iterator[RoutingTrace]:
    """For the forwards inside the block, route with ``recorded`` (``(B, T, layers, K)`` int, -1 = no record;
    None = route freely, only tracing) and yield the :class:`RoutingTrace` of the forward."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no MoE layers: there is no routing to replay")
    if recorded is not None:
        if recorded.dim() != 4 or recorded.shape[0] != batch or recorded.shape[2] != len(routers) or recorded.shape[3] != routers[0].top_k:
            raise ValueError(f"recorded routing of shape {list(recorded.shape)} does not fit (batch {batch}, tokens, "
                             f"{len(routers)} MoE layers, top-{routers[0].top_k})")
    trace = RoutingTrace()
    try:
        for layer, router in enumerate(routers):
            ids = None
            if recorded is not None:
                ids = recorded[:, :, layer].reshape(-1, recorded.shape[-1]).to(device=router.weight.device, dtype=torch.long)
            router.forward = _forced_forward(router, ids, trace, batch)  # instance attribute: this model only
        yield trace
    finally:
        for router in routers:
            router.__dict__.pop("forward", None)
