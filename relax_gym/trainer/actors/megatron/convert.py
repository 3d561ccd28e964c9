"""HF <-> Megatron weight conversion for Qwen2 / Qwen3-style dense decoders (the thinker's text decoder is one).

Our own converter: of the bridges on PyPI, ``megatron-bridge`` does not install without CUDA (it builds
``mamba-ssm``) and ``mbridge`` builds its models with Transformer Engine layer specs (CUDA only) and has no
Qwen2.5-Omni bridge. The models here use megatron-core's local layer spec, whose names are:

==============================================  ===================================================================
transformers (``{p}`` = ``model.`` or the         megatron-core ``GPTModel`` (local spec)
thinker's ``model.language_model.``)
==============================================  ===================================================================
``{p}embed_tokens.weight``                       ``embedding.word_embeddings.weight``
``{p}layers.i.input_layernorm.weight``           ``decoder.layers.i.input_layernorm.weight``
``{p}layers.i.self_attn.{q,k,v}_proj.weight``    ``decoder.layers.i.self_attention.linear_qkv.weight`` (grouped)
``{p}layers.i.self_attn.{q,k,v}_proj.bias``      ``decoder.layers.i.self_attention.linear_qkv.bias`` (Qwen2)
``{p}layers.i.self_attn.{q,k}_norm.weight``      ``decoder.layers.i.self_attention.{q,k}_layernorm.weight`` (Qwen3)
``{p}layers.i.self_attn.o_proj.weight``          ``decoder.layers.i.self_attention.linear_proj.weight``
``{p}layers.i.post_attention_layernorm.weight``  ``decoder.layers.i.pre_mlp_layernorm.weight``
``{p}layers.i.mlp.{gate,up}_proj.weight``        ``decoder.layers.i.mlp.linear_fc1.weight`` (gate rows, then up)
``{p}layers.i.mlp.down_proj.weight``             ``decoder.layers.i.mlp.linear_fc2.weight``
``{p}norm.weight``                               ``decoder.final_layernorm.weight``
``lm_head.weight``                               ``output_layer.weight`` (absent when tied to the embedding)
==============================================  ===================================================================

``linear_qkv`` holds, for each key/value group in turn, the group's query heads, then its key head, then its
value head. Every conversion only copies and reorders rows, so HF -> Megatron -> HF is bit-exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DecoderShape", "hf_to_megatron", "megatron_to_hf"]


@dataclass(frozen=True)
class DecoderShape:
    """What the conversion needs to know about a decoder."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def of(cls, text_config: Any) -> DecoderShape:
        heads = int(text_config.num_attention_heads)
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        return cls(num_layers=int(text_config.num_hidden_layers), num_heads=heads,
                   num_kv_heads=int(text_config.num_key_value_heads), head_dim=int(head_dim),
                   tied=bool(getattr(text_config, "tie_word_embeddings", False)))

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


_SAME_PER_LAYER = {  # HF suffix -> Megatron suffix, copied as is
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}


def _take(state: Mapping[str, torch.Tensor], name: str, where: str) -> torch.Tensor:
    try:
        return state[name]
    except KeyError:
        raise KeyError(f"{where}: no tensor {name!r} (is this the right prefix / model family?)") from None


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: DecoderShape) -> torch.Tensor:
    g, d, hpg = shape.num_kv_heads, shape.head_dim, shape.heads_per_group
    rest = q.shape[1:]
    parts = (q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest))
    return torch.cat(parts, dim=1).reshape(g * (hpg + 2) * d, *rest)


def _split_qkv(qkv: torch.Tensor, shape: DecoderShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = shape.num_kv_heads, shape.head_dim, shape.heads_per_group
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *rest)
    q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
    return (q.reshape(g * hpg * d, *rest).contiguous(), k.reshape(g * d, *rest).contiguous(),
            v.reshape(g * d, *rest).contiguous())


def hf_to_megatron(hf: Mapping[str, torch.Tensor], shape: DecoderShape, *, prefix: str = "model.",
                   lm_head: str = "lm_head.weight", dense_mlp: bool = True) -> dict[str, torch.Tensor]:
    """The decoder's tensors of an HF state dict (keys under ``prefix``, plus ``lm_head``) in Megatron names.
    Tensors of other parts (vision / audio towers) are ignored. ``dense_mlp=False``: the layers' MLPs are MoE blocks,
    left to :mod:`~relax_gym.trainer.actors.megatron.moe`."""
    where = "HF -> Megatron"
    out = {"embedding.word_embeddings.weight": _take(hf, f"{prefix}embed_tokens.weight", where)}
    for i in range(shape.num_layers):
        src, dst = f"{prefix}layers.{i}.", f"decoder.layers.{i}."
        for hf_suffix, mc_suffix in _SAME_PER_LAYER.items():
            if f"{src}{hf_suffix}" in hf:
                out[f"{dst}{mc_suffix}"] = hf[f"{src}{hf_suffix}"]
        for kind in ("weight", "bias"):
            names = [f"{src}self_attn.{p}_proj.{kind}" for p in "qkv"]
            if kind == "bias" and names[0] not in hf:
                continue
            q, k, v = (_take(hf, n, where) for n in names)
            out[f"{dst}self_attention.linear_qkv.{kind}"] = _fuse_qkv(q, k, v, shape)
        if dense_mlp:
            gate, up = (_take(hf, f"{src}mlp.{p}_proj.weight", where) for p in ("gate", "up"))
            out[f"{dst}mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    out["decoder.final_layernorm.weight"] = _take(hf, f"{prefix}norm.weight", where)
    if not shape.tied:
        out["output_layer.weight"] = _take(hf, lm_head, where)
    return out


def megatron_to_hf(mc: Mapping[str, torch.Tensor], shape: DecoderShape, *, prefix: str = "model.",
                   lm_head: str = "lm_head.weight", dense_mlp: bool = True) -> dict[str, torch.Tensor]:
    """A Megatron ``GPTModel`` state dict (``_extra_state`` entries ignored) in HF names. With tied embeddings
    ``lm_head`` is the embedding tensor itself, as in the HF model's own state dict. ``dense_mlp=False``: MoE MLPs,
    converted by :mod:`~relax_gym.trainer.actors.megatron.moe`."""
    where = "Megatron -> HF"
    embed = _take(mc, "embedding.word_embeddings.weight", where)
    out = {f"{prefix}embed_tokens.weight": embed}
    for i in range(shape.num_layers):
        src, dst = f"decoder.layers.{i}.", f"{prefix}layers.{i}."
        for kind in ("weight", "bias"):
            name = f"{src}self_attention.linear_qkv.{kind}"
            if kind == "bias" and name not in mc:
                continue
            q, k, v = _split_qkv(_take(mc, name, where), shape)
            out.update({f"{dst}self_attn.q_proj.{kind}": q, f"{dst}self_attn.k_proj.{kind}": k,
                        f"{dst}self_attn.v_proj.{kind}": v})
        for hf_suffix, mc_suffix in _SAME_PER_LAYER.items():
            if f"{src}{mc_suffix}" in mc:
                out[f"{dst}{hf_suffix}"] = mc[f"{src}{mc_suffix}"]
        if dense_mlp:
            gate, up = torch.chunk(_take(mc, f"{src}mlp.linear_fc1.weight", where), 2, dim=0)
            out[f"{dst}mlp.gate_proj.weight"] = gate.contiguous()
            out[f"{dst}mlp.up_proj.weight"] = up.contiguous()
    out[f"{prefix}norm.weight"] = _take(mc, "decoder.final_layernorm.weight", where)
    out[lm_head] = embed if shape.tied else _take(mc, "output_layer.weight", where)
    return out
