"""The thinker with megatron-core's ``GPTModel`` as its language decoder.

:func:`to_megatron` takes a transformers Qwen2.5-Omni thinker and swaps, in place, its text decoder
(``model.language_model``) and output head (``lm_head``) for a megatron-core ``GPTModel`` (local layer spec,
multimodal rotary embedding ``mrope`` with the thinker's rope sections) holding the same weights. The vision and
audio towers, the merge of their features into the token embeddings and the 3-D rope position ids stay
transformers' own code, so a forward is the thinker's forward with megatron-core's decoder in the middle:

    thinker.model(**batch)   # HF: embed (Megatron's embedding table), towers, merge, rope index
      -> MegatronLanguageModel(inputs_embeds, position_ids (3, B, T), attention_mask)
           GPTModel.rotary_pos_emb (mrope) + GPTModel.decoder (TransformerBlock: layers, final RMSNorm)
    thinker.lm_head(hidden)  -> GPTModel.output_layer (tied to the embedding table when the thinker ties them)

The thinker's own ``state_dict`` then has Megatron names for the decoder; :func:`hf_state_dict` gives the HF names
(what engines load), :func:`load_hf_state_dict` takes them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from relax_gym.trainer.actors.megatron import qwen3_omni
from relax_gym.trainer.actors.megatron.convert import DecoderShape, hf_to_megatron, megatron_to_hf
from relax_gym.trainer.actors.megatron.decoder import MegatronLanguageModel, MegatronLMHead
from relax_gym.trainer.actors.megatron.shard import full_decoder_state, local_decoder_state, padded_vocab

__all__ = ["build_gpt", "gather_hf_decoder", "gpt_of", "hf_state_dict",
           "is_megatron", "load_hf_decoder", "load_hf_state_dict", "to_megatron", "transformer_config"]

DECODER_PREFIX = "model.language_model."  # the thinker's text decoder, in its state_dict
HEAD = "lm_head.weight"
_GPT_PARTS = ("embedding.", "decoder.", "output_layer.", "rotary_pos_emb.")  # GPTModel state-dict names
_HF_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu}


def _qk_norm(text_config: Any) -> bool:
    """Qwen3 normalises queries and keys per head; Qwen2 (and the Omni thinker's decoder) does not."""
    return str(getattr(text_config, "model_type", "")).startswith("qwen3")


def transformer_config(text_config: Any, *, dtype: torch.dtype = torch.float32, tensor_parallel: int = 1,
                       pipeline_parallel: int = 1, context_parallel: int = 1, expert_parallel: int = 1,
                       **extra: Any) -> Any:
    """megatron-core's ``TransformerConfig`` for a Qwen2-style text config (qkv bias, RMSNorm, SwiGLU, mrope):
    local attention and every fusion off, so it runs on a CPU as on a GPU; dropout off (as the HF policy).
    ``extra``: more ``TransformerConfig`` fields (the MoE ones of :func:`~.moe.moe_config_fields`)."""
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    act = getattr(text_config, "hidden_act", "silu")
    if act not in _HF_ACTIVATIONS:
        raise ValueError(f"hidden_act={act!r} has no Megatron counterpart here (supported: {sorted(_HF_ACTIVATIONS)})")
    shape = DecoderShape.of(text_config)
    rope = getattr(text_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type={rope.get('rope_type')!r}: only the default (unscaled) rope converts to Megatron")
    mrope = rope.get("mrope_section")
    fields = dict(
        num_layers=shape.num_layers,
        hidden_size=int(text_config.hidden_size),
        ffn_hidden_size=int(text_config.intermediate_size),
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=float(text_config.rms_norm_eps),
        add_bias_linear=False,
        add_qkv_bias=bool(getattr(text_config, "attention_bias", True)),  # Qwen2: always; Qwen3: attention_bias
        qk_layernorm=_qk_norm(text_config),
        gated_linear_unit=True,
        activation_func=_HF_ACTIVATIONS[act],
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mrope_section=list(mrope) if mrope else None,
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        context_parallel_size=context_parallel,
        expert_model_parallel_size=expert_parallel,
        # pipeline stages pass activations of each micro-batch's own length (the shape travels first), one send or
        # receive at a time (gloo has no batched p2p)
        pipeline_dtype=dtype,
        variable_seq_lengths=pipeline_parallel > 1,
        batch_p2p_comm=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,  # the weights come from the HF model
        attention_backend=AttnBackend.local,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        # the dense decoder never dispatches tokens, but megatron-core refuses variable sequence lengths with the
        # default (allgather) dispatcher; an MoE decoder's own fields (moe.py) choose its dispatcher
        moe_token_dispatcher_type="alltoall",
    )
    return TransformerConfig(**{**fields, **extra})


def build_gpt(text_config: Any, **kwargs: Any) -> Any:
    """An (unfilled) ``GPTModel`` shaped like ``text_config``'s decoder; ``kwargs`` go to :func:`transformer_config`."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from megatron.core import parallel_state as ps

    # -- MoE family (model.family=qwen3_omni_moe): expert fields and the MoE layer spec come from moe.py --
    from relax_gym.trainer.actors.megatron import moe

    if moe.is_moe(text_config):
        kwargs = {**moe.moe_config_fields(text_config, expert_parallel=moe.expert_parallel_size()), **kwargs}
    config = transformer_config(text_config, **kwargs)
    spec = (moe.layer_spec(config) if moe.is_moe(text_config)
            else get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=config.qk_layernorm))
    # -- end MoE family --
    rope = getattr(text_config, "rope_parameters", None) or {}
    gpt = GPTModel(
        config,
        spec,
        vocab_size=padded_vocab(int(text_config.vocab_size), config.tensor_model_parallel_size),
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        parallel_output=False,  # the head gathers the vocabulary slices: each tensor rank gets whole logits
        max_sequence_length=int(text_config.max_position_embeddings),
        position_embedding_type="mrope" if config.mrope_section else "rope",
        rotary_base=int(rope.get("rope_theta", getattr(text_config, "rope_theta", 10_000))),
        share_embeddings_and_output_weights=bool(getattr(text_config, "tie_word_embeddings", False)),
    )
    # -- Qwen3-Omni: interleaved multimodal rope (qwen3_omni.py) --
    if qwen3_omni.interleaved_mrope(text_config):
        gpt.rotary_pos_emb = qwen3_omni.InterleavedMRope(config.kv_channels, float(rope.get("rope_theta", 10_000)))
    _mark_tensor_parallel(gpt)
    _params_in_dtype(gpt, config.params_dtype)
    return gpt


def _params_in_dtype(gpt: nn.Module, dtype: torch.dtype) -> None:
    """Every parameter of ``gpt`` in ``dtype``. Without Apex or Transformer Engine (any CPU install) megatron-core's
    local spec makes its norms with ``torch.nn.RMSNorm``, whose weight is in torch's default dtype (float32)
    whatever ``params_dtype`` says; Megatron-LM casts the whole model to bf16 (``Float16Module``). Left as they
    were, a bf16 thinker's norms would come back from the conversion as float32 tensors, and go out so in its
    state dict, checkpoints and weight pushes. Cast in place (``.data``): the parameters keep their
    tensor-parallel marks."""
    for param in gpt.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


def _mark_tensor_parallel(gpt: nn.Module) -> None:
    """Mark the tensors megatron-core's parallel layers split (``tensor_model_parallel``, ``partition_dim``): it
    marks them only while initialising weights itself, and here the weights come from the HF model."""
    from megatron.core.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                                      set_tensor_model_parallel_attributes)

    split = ((VocabParallelEmbedding, {"weight": 0}), (ColumnParallelLinear, {"weight": 0, "bias": 0}),
             (RowParallelLinear, {"weight": 1}))
    for module in gpt.modules():
        for cls, dims in split:
            if isinstance(module, cls):
                for name, dim in dims.items():
                    param = getattr(module, name, None)
                    if isinstance(param, nn.Parameter) and not getattr(param, "tensor_model_parallel", False):
                        set_tensor_model_parallel_attributes(param, True, dim, 1)


def is_megatron(thinker: nn.Module) -> bool:
    return isinstance(getattr(getattr(thinker, "model", None), "language_model", None), MegatronLanguageModel)


def gpt_of(thinker: nn.Module) -> nn.Module:
    if not is_megatron(thinker):
        raise TypeError(f"{type(thinker).__name__} has no Megatron decoder (see relax_gym.trainer.actors.megatron.model.to_megatron)")
    return thinker.model.language_model.gpt


def to_megatron(thinker: nn.Module, *, device: torch.device | str = "cpu", **kwargs: Any) -> nn.Module:
    """Swap ``thinker``'s text decoder and head for a megatron-core GPTModel with the same weights (in place;
    returns ``thinker``). megatron-core's parallel state must be set up first (``megatron_runtime.acquire``)."""
    if is_megatron(thinker):
        return thinker
    text_config = thinker.config.get_text_config()
    shape = DecoderShape.of(text_config)
    if shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"num_attention_heads ({shape.num_heads}) must be a multiple of num_key_value_heads "
                         f"({shape.num_kv_heads})")
    dtype = next(thinker.parameters()).dtype
    hf_state = thinker.state_dict()
    gpt = build_gpt(text_config, dtype=dtype, **kwargs)
    load_hf_decoder(gpt, hf_state, text_config)
    thinker._hf_keys = tuple(hf_state)  # the HF state dict's names, in order
    thinker.model.language_model = _language_model_class(text_config)(gpt, text_config)
    thinker.lm_head = MegatronLMHead(gpt, int(text_config.vocab_size))
    if not gpt.pre_process:  # a later pipeline stage: the towers and their merge live on the first one
        for name, _ in list(thinker.model.named_children()):
            if name != "language_model":
                setattr(thinker.model, name, None)
    return thinker.to(device)


# -- family switch: MoE decoders (model.family=qwen3_omni_moe) convert through moe.py, Qwen3-Omni's deepstack is
# -- added by qwen3_omni.py; dense ones through convert.py as before --

def _decoder_to_megatron(state: Mapping[str, torch.Tensor], text_config: Any) -> dict[str, torch.Tensor]:
    from relax_gym.trainer.actors.megatron import moe

    if moe.is_moe(text_config):
        return moe.decoder_hf_to_megatron(state, text_config, prefix=DECODER_PREFIX, lm_head=HEAD)
    return hf_to_megatron(state, DecoderShape.of(text_config), prefix=DECODER_PREFIX, lm_head=HEAD)


def _decoder_to_hf(state: Mapping[str, torch.Tensor], text_config: Any) -> dict[str, torch.Tensor]:
    from relax_gym.trainer.actors.megatron import moe

    if moe.is_moe(text_config):
        return moe.decoder_megatron_to_hf(state, text_config, prefix=DECODER_PREFIX, lm_head=HEAD)
    return megatron_to_hf(state, DecoderShape.of(text_config), prefix=DECODER_PREFIX, lm_head=HEAD)


def _language_model_class(text_config: Any) -> type[MegatronLanguageModel]:
    return qwen3_omni.Qwen3OmniLanguageModel if str(text_config.model_type).startswith("qwen3_omni") else MegatronLanguageModel

# -- end family switch --


def load_hf_decoder(gpt: nn.Module, state: Mapping[str, torch.Tensor], text_config: Any) -> None:
    """This rank's part of the text decoder and head, cut from ``state`` (a whole HF thinker state dict: every
    layer, every expert, the unpadded vocabulary), copied into ``gpt``. The one way HF weights enter a ``GPTModel``
    (:func:`to_megatron`, :func:`load_hf_state_dict`); on its own it lets the conversion be checked from state dicts
    at real widths without building the HF thinker (tests/trainer/actors/megatron/test_real_width_megatron.py)."""
    _load_decoder(gpt, local_decoder_state(_decoder_to_megatron(state, text_config), gpt))


def gather_hf_decoder(gpt: nn.Module, text_config: Any,
                      extra: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The whole text decoder and head under HF names, gathered from every tensor, pipeline and expert rank (a
    collective: every rank calls it; each gets the whole); ``extra`` (this rank's tower tensors) is gathered with it
    and comes back under its own names. The one way weights leave a ``GPTModel`` (:func:`hf_state_dict`)."""
    whole = full_decoder_state(gpt, int(text_config.vocab_size), extra=extra)
    towers = {k: v for k, v in whole.items() if not k.startswith(_GPT_PARTS)}  # every stage's extra
    return {**towers, **_decoder_to_hf(whole, text_config)}


def _load_decoder(gpt: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    own = gpt.state_dict()
    missing = [k for k in own if not k.endswith("_extra_state") and k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise KeyError(f"Megatron decoder weights do not match the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)


def _towers(thinker: nn.Module) -> dict[str, torch.Tensor]:
    """The thinker's non-decoder tensors (vision and audio towers) this rank holds, in HF names (none on a later
    pipeline stage)."""
    return {k: v for k, v in thinker.state_dict().items() if not k.startswith((DECODER_PREFIX, "lm_head."))}


def hf_state_dict(thinker: nn.Module) -> dict[str, torch.Tensor]:
    """The Megatron thinker's weights under the HF thinker's names, in its order (detached; shared storage where
    this rank holds a tensor whole). With tensor or pipeline parallel ranks this gathers them: a collective that
    every rank of the group calls, each one getting the whole."""
    gpt = gpt_of(thinker)
    text_config = thinker.config.get_text_config()
    merged = gather_hf_decoder(gpt, text_config, extra=_towers(thinker))
    return {k: merged[k].detach() for k in thinker._hf_keys}


def load_hf_state_dict(thinker: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy HF-named weights (a full thinker state dict) into the Megatron thinker."""
    missing = [k for k in thinker._hf_keys if k not in state]
    if missing:
        raise KeyError(f"HF state dict lacks {len(missing)} thinker tensor(s): {missing[:4]}")
    gpt = gpt_of(thinker)
    load_hf_decoder(gpt, state, thinker.config.get_text_config())
    own = thinker.state_dict()
    with torch.no_grad():
        for name in _towers(thinker):
            own[name].copy_(state[name])
