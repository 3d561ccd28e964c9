"""Mixture-of-experts decoders (``model.family=qwen3_omni_moe``) on megatron-core: config, layer spec, weight names,
expert-parallel slicing.

The Qwen3-Omni MoE thinker's text decoder is a Qwen3 decoder (q/k RMSNorm, no qkv bias) whose MLPs are sparse MoE
blocks: a router (softmax over ``num_experts`` logits, top-k, renormalised when ``norm_topk_prob``) and
``num_experts`` SwiGLU experts. On megatron-core 0.16.1 that is the local layer spec with ``num_experts`` (a
``MoELayer``: ``TopKRouter`` + ``SequentialMLP`` of local ``MLP`` experts; no grouped GEMM, which needs CUDA
kernels) and these config fields (:func:`moe_config_fields`):

- ``moe_router_score_function="softmax"``, ``moe_router_pre_softmax=False``: the top-k of the logits, then a softmax
  over those k logits -- the same as softmax over all experts, top-k, renormalised (``norm_topk_prob=True``).
  Without ``norm_topk_prob`` the softmax goes first (``moe_router_pre_softmax=True``) and is not renormalised.
- no load balancing loss, no z-loss, no token dropping, no fusions (CPU);
- ``moe_token_dispatcher_type="allgather"``: the all-to-all dispatcher creates a ``torch.cuda.Stream`` when it is
  built (it fails on a CPU-only torch); the all-gather one uses plain collectives: with expert parallel 1 it only
  permutes tokens locally, with expert parallel > 1 it all-gathers the tokens of the expert-parallel group, runs
  the rank's experts on them and reduce-scatters the results (gloo on a CPU; ``tests/trainer/test_megatron_moe_ep.py``);
- ``moe_enable_routing_replay=True``: every router gets a ``RouterReplay`` hook, used by
  :mod:`~relax_gym.trainer.actors.megatron.replay` (it does nothing while no replay action is set).

Weight names (per MoE layer ``i``; ``{p}`` = the thinker's ``model.language_model.``):

=================================================  ============================================================
transformers                                        megatron-core (local spec, ``SequentialMLP``)
=================================================  ============================================================
``{p}layers.i.mlp.gate.weight`` (E, H)              ``decoder.layers.i.mlp.router.weight``
``{p}layers.i.mlp.experts.gate_up_proj`` (E, 2I, H)  ``decoder.layers.i.mlp.experts.local_experts.j.linear_fc1.weight``
                                                     (2I, H): expert ``j``'s gate rows, then its up rows
``{p}layers.i.mlp.experts.down_proj`` (E, H, I)      ``decoder.layers.i.mlp.experts.local_experts.j.linear_fc2.weight``
=================================================  ============================================================

With expert parallel size ``ep`` the experts are split in ``ep`` contiguous blocks: rank ``r`` holds global experts
``r * E/ep ... (r + 1) * E/ep - 1`` as its local experts ``0 ... E/ep - 1`` (megatron-core's layout,
:func:`local_experts`). :func:`hf_to_megatron_experts` takes the full HF tensors and keeps the rank's block;
:func:`megatron_to_hf_experts` takes the local experts of every rank (gathered by the caller) and stacks them back.
Every conversion copies or stacks tensors only, so HF -> Megatron -> HF is bit-exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MoEShape", "decoder_hf_to_megatron", "decoder_megatron_to_hf", "expert_parallel_size",
           "gather_expert_shards", "hf_to_megatron_experts", "is_expert_key", "is_moe", "layer_spec", "local_experts",
           "megatron_to_hf_experts", "moe_config_fields", "shard_experts"]


def is_moe(text_config: Any) -> bool:
    """A decoder with sparse MoE layers (Qwen3-Omni MoE, Qwen3-MoE style configs)."""
    return int(getattr(text_config, "num_experts", 0) or 0) > 0


@dataclass(frozen=True)
class MoEShape:
    """What the MoE conversion needs to know about a decoder."""

    num_layers: int
    num_experts: int
    top_k: int
    expert_hidden: int  # moe_intermediate_size
    norm_topk_prob: bool

    @classmethod
    def of(cls, text_config: Any) -> MoEShape:
        layers = int(text_config.num_hidden_layers)
        dense = [i for i in range(layers) if not _sparse(text_config, i)]
        if dense:
            raise ValueError(f"decoder layers {dense} are dense MLPs (mlp_only_layers / decoder_sparse_step): the "
                             "megatron backend converts decoders whose every layer is a MoE layer")
        return cls(num_layers=layers, num_experts=int(text_config.num_experts),
                   top_k=int(text_config.num_experts_per_tok), expert_hidden=int(text_config.moe_intermediate_size),
                   norm_topk_prob=bool(getattr(text_config, "norm_topk_prob", True)))


def _sparse(text_config: Any, layer: int) -> bool:
    step = int(getattr(text_config, "decoder_sparse_step", 1) or 1)
    return layer not in (getattr(text_config, "mlp_only_layers", None) or []) and (layer + 1) % step == 0


def moe_config_fields(text_config: Any, *, expert_parallel: int = 1) -> dict[str, Any]:
    """The ``TransformerConfig`` fields that make every decoder layer a MoE layer routing as ``text_config`` does."""
    shape = MoEShape.of(text_config)
    if shape.num_experts % expert_parallel:
        raise ValueError(f"num_experts ({shape.num_experts}) must be a multiple of expert parallel size ({expert_parallel})")
    act = getattr(text_config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"MoE experts with hidden_act={act!r}: only SwiGLU (silu) experts convert")
    return {
        "num_moe_experts": shape.num_experts,
        "moe_ffn_hidden_size": shape.expert_hidden,
        "moe_router_topk": shape.top_k,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not shape.norm_topk_prob,  # top-k of logits then softmax == renormalised top-k
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_z_loss_coeff": None,
        "moe_grouped_gemm": False,
        "moe_token_dispatcher_type": "allgather",  # alltoall needs CUDA streams
        "moe_permute_fusion": False,
        "moe_router_fusion": False,
        "moe_enable_routing_replay": True,  # a RouterReplay hook per router (idle unless replay.py arms it)
        "expert_model_parallel_size": expert_parallel,
    }


def define_missing_te_gemm() -> None:
    """megatron-core 0.16.1's ``moe_utils`` imports ``te_general_gemm`` from Transformer Engine in a ``try`` whose
    ``except ImportError`` does not define it, so without Transformer Engine (any CPU install, and GPU installs
    without it) the router's ``RouterGatingLinearFunction`` raises ``NameError``. ``None`` is what its code tests
    for: the router then uses ``torch.mm``. Changes nothing when the name exists."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def layer_spec(config: Any) -> Any:
    """megatron-core's local layer spec with a MoE MLP (``SequentialMLP`` experts) and Qwen3's q/k RMSNorm."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    define_missing_te_gemm()

    return get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False,
                                    qk_layernorm=config.qk_layernorm, normalization="RMSNorm")


# -- expert parallel: which experts a rank holds ---------------------------------------------------------------------

def local_experts(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """The global expert ids that expert-parallel rank ``ep_rank`` of ``ep_size`` holds (a contiguous block)."""
    if ep_size < 1 or not 0 <= ep_rank < ep_size:
        raise ValueError(f"expert parallel rank {ep_rank} of {ep_size}")
    if num_experts % ep_size:
        raise ValueError(f"{num_experts} experts do not split over {ep_size} expert-parallel ranks")
    per_rank = num_experts // ep_size
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


def shard_experts(full: torch.Tensor, ep_size: int, ep_rank: int) -> torch.Tensor:
    """Rank ``ep_rank``'s block of a per-expert tensor (experts on dim 0); a view of ``full``."""
    ids = local_experts(full.shape[0], ep_size, ep_rank)
    return full[ids.start : ids.stop]


def gather_expert_shards(shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full per-expert tensor from every rank's block, in rank order (the inverse of :func:`shard_experts`)."""
    sizes = {s.shape[0] for s in shards}
    if len(sizes) != 1:
        raise ValueError(f"expert shards hold different numbers of experts: {[s.shape[0] for s in shards]}")
    return torch.cat(list(shards), dim=0)


# -- names ---------------------------------------------------------------------------------------------------------

def _take(state: Mapping[str, torch.Tensor], name: str, where: str) -> torch.Tensor:
    try:
        return state[name]
    except KeyError:
        raise KeyError(f"{where}: no tensor {name!r} (is this a MoE decoder with this prefix?)") from None


def _expert_key(layer: int, local: int, linear: str) -> str:
    return f"decoder.layers.{layer}.mlp.experts.local_experts.{local}.{linear}.weight"


def hf_to_megatron_experts(hf: Mapping[str, torch.Tensor], shape: MoEShape, *, prefix: str = "model.",
                           ep_size: int = 1, ep_rank: int = 0) -> dict[str, torch.Tensor]:
    """The routers and the experts of rank ``ep_rank`` in Megatron names, from a full HF state dict."""
    where = "HF -> Megatron (MoE)"
    out: dict[str, torch.Tensor] = {}
    for i in range(shape.num_layers):
        src = f"{prefix}layers.{i}.mlp."
        out[f"decoder.layers.{i}.mlp.router.weight"] = _take(hf, f"{src}gate.weight", where)
        gate_up = shard_experts(_take(hf, f"{src}experts.gate_up_proj", where), ep_size, ep_rank)
        down = shard_experts(_take(hf, f"{src}experts.down_proj", where), ep_size, ep_rank)
        for j in range(gate_up.shape[0]):
            out[_expert_key(i, j, "linear_fc1")] = gate_up[j]  # (2I, H): gate rows then up rows, as Megatron's fc1
            out[_expert_key(i, j, "linear_fc2")] = down[j]
    return out


def megatron_to_hf_experts(ranks: Sequence[Mapping[str, torch.Tensor]], shape: MoEShape, *,
                           prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The routers and experts in HF names from the Megatron state dicts of every expert-parallel rank, in rank order
    (one dict without expert parallelism). The router is replicated: it is read from the first."""
    where = "Megatron -> HF (MoE)"
    per_rank = shape.num_experts // len(ranks)
    out: dict[str, torch.Tensor] = {}
    for i in range(shape.num_layers):
        dst = f"{prefix}layers.{i}.mlp."
        out[f"{dst}gate.weight"] = _take(ranks[0], f"decoder.layers.{i}.mlp.router.weight", where)
        for linear, name in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
            shards = [torch.stack([_take(mc, _expert_key(i, j, linear), where) for j in range(per_rank)])
                      for mc in ranks]
            out[f"{dst}experts.{name}"] = gather_expert_shards(shards)
    return out


def is_expert_key(megatron_name: str) -> bool:
    """A Megatron decoder tensor that lives on one expert-parallel rank only."""
    return ".mlp.experts.local_experts." in megatron_name


# -- whole decoders (what model.py calls for a MoE text config) ------------------------------------------------------

def _expert_parallel() -> tuple[int, int, Any]:
    """(size, rank, group) of megatron-core's expert-parallel group; (1, 0, None) when it is not set up."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1, 0, None
    size = parallel_state.get_expert_model_parallel_world_size()
    if size == 1:
        return 1, 0, None
    return size, parallel_state.get_expert_model_parallel_rank(), parallel_state.get_expert_model_parallel_group()


def expert_parallel_size() -> int:
    return _expert_parallel()[0]


def decoder_hf_to_megatron(hf: Mapping[str, torch.Tensor], text_config: Any, *, prefix: str,
                           lm_head: str) -> dict[str, torch.Tensor]:
    """A MoE decoder's tensors of a full HF state dict in Megatron names, with this rank's experts only."""
    from relax_gym.trainer.actors.megatron.convert import DecoderShape, hf_to_megatron

    size, rank, _ = _expert_parallel()
    out = hf_to_megatron(hf, DecoderShape.of(text_config), prefix=prefix, lm_head=lm_head, dense_mlp=False)
    out.update(hf_to_megatron_experts(hf, MoEShape.of(text_config), prefix=prefix, ep_size=size, ep_rank=rank))
    return out


def decoder_megatron_to_hf(mc: Mapping[str, torch.Tensor], text_config: Any, *, prefix: str,
                           lm_head: str) -> dict[str, torch.Tensor]:
    """A MoE ``GPTModel`` state dict in HF names, every expert included: under expert parallelism each rank's local
    experts are all-gathered over the expert-parallel group (a collective: every rank of the group must call it)."""
    from relax_gym.trainer.actors.megatron.convert import DecoderShape, megatron_to_hf

    size, _, group = _expert_parallel()
    shape = MoEShape.of(text_config)
    out = megatron_to_hf(mc, DecoderShape.of(text_config), prefix=prefix, lm_head=lm_head, dense_mlp=False)
    if size == 1:
        out.update(megatron_to_hf_experts([mc], shape, prefix=prefix))
    else:
        out.update(_gather_experts(mc, shape, prefix=prefix, group=group))
    return out


def _gather_experts(mc: Mapping[str, torch.Tensor], shape: MoEShape, *, prefix: str, group: Any
                    ) -> dict[str, torch.Tensor]:
    """The routers and every expert in HF names from this rank's local experts and the other expert-parallel
    ranks' (a collective over ``group``): each rank's block of experts is broadcast straight into its rows of the
    stacked HF tensor, so a layer's experts exist once. (Gathering them per expert with ``all_gather``, then stacking
    the ranks' shards and concatenating them, held three copies; measured for one Qwen3-Omni-30B-A3B layer in bf16
    at expert parallel 2 on a CPU: +3.1 GB and 15 s per rank, against +1.2 GB and 2.5 s this way.)"""
    import torch.distributed as dist

    where = "Megatron -> HF (MoE, expert parallel)"
    ranks = dist.get_process_group_ranks(group)  # expert-parallel rank r is ranks[r]
    per_rank = shape.num_experts // len(ranks)
    me = dist.get_rank()
    out: dict[str, torch.Tensor] = {}
    for i in range(shape.num_layers):
        dst = f"{prefix}layers.{i}.mlp."
        out[f"{dst}gate.weight"] = _take(mc, f"decoder.layers.{i}.mlp.router.weight", where)
        for linear, name in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
            first = _take(mc, _expert_key(i, 0, linear), where).detach()
            full = first.new_empty((shape.num_experts, *first.shape))
            for r, src in enumerate(ranks):
                block = full[r * per_rank:(r + 1) * per_rank]
                if src == me:
                    for j in range(per_rank):
                        block[j].copy_(_take(mc, _expert_key(i, j, linear), where))
                dist.broadcast(block, src=src, group=group)
            out[f"{dst}experts.{name}"] = full
    return out
