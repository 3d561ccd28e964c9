"""What stands in for the thinker's HF text decoder and output head once megatron-core's ``GPTModel`` runs them
(:func:`~relax_gym.trainer.actors.megatron.model.to_megatron` swaps them in): same calls, same outputs. The
Qwen3-Omni decoder (:mod:`.qwen3_omni`) extends :class:`MegatronLanguageModel`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPast

__all__ = ["MegatronLMHead", "MegatronLanguageModel"]


def _blocked(attention_mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """megatron-core's attention mask (B, 1, T, T), True where a query may not look: later positions and padding.
    Given explicitly, so the local attention never builds its own (CUDA) causal mask."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)
    blocked = causal.expand(batch, 1, length, length)
    if attention_mask is not None:
        blocked = blocked | ~attention_mask.bool().to(device)[:, None, None, :]
    return blocked


class MegatronLanguageModel(nn.Module):
    """Stands in for the thinker's HF text decoder (``thinker.model.language_model``): same call, same output."""

    def __init__(self, gpt: nn.Module, text_config: Any) -> None:
        super().__init__()
        self.gpt = gpt
        self.config = text_config

    def get_input_embeddings(self) -> nn.Module:
        return self.gpt.embedding.word_embeddings

    @property
    def layers(self) -> nn.ModuleList:
        """The decoder layers (megatron-core ``TransformerLayer``s), where code that inspects HF decoders looks."""
        return self.gpt.decoder.layers

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, inputs_embeds: torch.Tensor | None = None,
                use_cache: bool | None = None, **kwargs: Any) -> BaseModelOutputWithPast:
        if cache is not None or use_cache:
            raise ValueError("the Megatron decoder trains and scores whole sequences: no KV cache (generation runs "
                             "on the inference engine's HF model)")
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        hidden = self.decode(inputs_embeds.transpose(0, 1).contiguous(), attention_mask, position_ids,
                             batch=inputs_embeds.shape[0], length=inputs_embeds.shape[1])
        return BaseModelOutputWithPast(last_hidden_state=hidden.transpose(0, 1))

    def decode(self, hidden: torch.Tensor | None, attention_mask: torch.Tensor | None,
               position_ids: torch.Tensor | None, *, batch: int, length: int) -> torch.Tensor:
        """This pipeline stage's layers on ``hidden`` (T, B, H) -- ``None`` on a later stage, whose input the
        pipeline schedule has set (``gpt.set_input_tensor``) -- with the final norm on the last stage; (T, B, H)."""
        device = self.gpt.decoder.layers[0].input_layernorm.weight.device
        if position_ids is None:
            position_ids = torch.arange(length, device=device).expand(3, batch, length)
        elif position_ids.ndim == 2:
            position_ids = position_ids[None].expand(3, -1, -1)
        elif position_ids.shape[0] == 4:  # (text, t, h, w) of a packed batch: the text row is for masks only
            position_ids = position_ids[1:]
        gpt = self.gpt
        if gpt.position_embedding_type == "mrope":
            rotary = gpt.rotary_pos_emb(position_ids, gpt.mrope_section)
        else:
            rotary = gpt.rotary_pos_emb(length)
        return gpt.decoder(hidden_states=hidden, attention_mask=_blocked(attention_mask, batch, length, device),
                           rotary_pos_emb=rotary)


class MegatronLMHead(nn.Module):
    """Stands in for the thinker's ``lm_head``: ``GPTModel.output_layer`` (with the embedding table as its weight
    when tied). Holds the GPTModel without registering it again, so its weights appear once in state dicts."""

    def __init__(self, gpt: nn.Module, vocab: int) -> None:
        super().__init__()
        self._gpt = (gpt,)  # a tuple: not a registered submodule
        self.vocab = vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gpt = self._gpt[0]
        weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else None
        flat = hidden.reshape(-1, 1, hidden.shape[-1])  # (tokens, 1, hidden): the [s, b, h] layout it expects
        logits, _ = gpt.output_layer(flat, weight=weight)
        logits = logits[..., : self.vocab]  # the padding rows of the vocabulary are no tokens (see shard.py)
        return logits.reshape(*hidden.shape[:-1], logits.shape[-1])
