"""What the Qwen3-Omni thinker's text decoder does beyond a Qwen2.5-Omni one, on megatron-core's ``GPTModel``.

Two things, both outside megatron-core 0.16.1's GPT model:

- **interleaved multimodal rope** (``rope_parameters.mrope_interleaved``): the rotary frequencies are not split into
  contiguous temporal / height / width sections (megatron-core's ``MultimodalRotaryEmbedding``, Qwen2-VL style) but
  interleaved: frequency ``j`` follows the height position when ``j % 3 == 1`` and ``j < 3 * sections[1]``, the width
  position when ``j % 3 == 2`` and ``j < 3 * sections[2]``, the temporal one otherwise.
  :class:`InterleavedMRope` computes that and replaces ``GPTModel.rotary_pos_emb`` (same call, same output layout).
- **deepstack**: features of early vision-tower layers are added to the hidden states of the visual tokens after the
  first decoder layers. :class:`Qwen3OmniLanguageModel` adds them with forward hooks on those layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from relax_gym.trainer.actors.megatron.decoder import MegatronLanguageModel

__all__ = ["InterleavedMRope", "Qwen3OmniLanguageModel", "interleaved_mrope"]


def interleaved_mrope(text_config: Any) -> bool:
    rope = getattr(text_config, "rope_parameters", None) or {}
    return bool(rope.get("mrope_interleaved")) and bool(rope.get("mrope_section"))


class InterleavedMRope(nn.Module):
    """``GPTModel.rotary_pos_emb`` for interleaved mrope: ``(position_ids (3, B, T), sections) -> (T, B, 1, 2 * D/2)``."""

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))

    def forward(self, position_ids: torch.Tensor, mrope_section: Sequence[int], cp_group: Any = None) -> torch.Tensor:
        inv_freq = self.inv_freq.to(position_ids.device)
        freqs = position_ids.float()[..., None] * inv_freq  # (3, B, T, D/2)
        mixed = freqs[0].clone()
        for axis in (1, 2):  # height, width
            picked = slice(axis, 3 * int(mrope_section[axis]), 3)
            mixed[..., picked] = freqs[axis, ..., picked]
        emb = torch.cat([mixed, mixed], dim=-1)  # (B, T, D): rotate-half layout, as both HF and Megatron apply it
        return emb[:, :, None, :].transpose(0, 1).contiguous()


class Qwen3OmniLanguageModel(MegatronLanguageModel):
    """:class:`~relax_gym.trainer.actors.megatron.decoder.MegatronLanguageModel` plus the deepstack visual features."""

    def forward(self, *args: Any, visual_pos_masks: torch.Tensor | None = None,
                deepstack_visual_embeds: Sequence[torch.Tensor] | None = None, **kwargs: Any) -> Any:
        handles = []
        if deepstack_visual_embeds is not None and visual_pos_masks is not None:
            where = visual_pos_masks.transpose(0, 1)  # (T, B): Megatron's hidden states are (T, B, H)
            order = torch.arange(where.numel(), device=where.device).view(where.shape[1], where.shape[0]).t()
            rank = order[where]  # visual tokens in (T, B) order, numbered in the (B, T) order of the embeds
            for layer, embeds in zip(self.gpt.decoder.layers, deepstack_visual_embeds):
                handles.append(layer.register_forward_hook(_add_visual(where, embeds, rank)))
        try:
            return super().forward(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()


def _add_visual(where: torch.Tensor, embeds: torch.Tensor, rank: torch.Tensor):
    """A forward hook adding ``embeds`` (visual tokens in batch-major order) to a layer's output at ``where``."""
    _, ordering = torch.sort(rank)  # position in (T, B) order of the n-th visual token in (B, T) order

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        hidden, rest = (output[0], output[1:]) if isinstance(output, tuple) else (output, None)
        hidden = hidden.clone()
        aligned = torch.empty_like(embeds)
        aligned[ordering] = embeds  # row m: the embed of the m-th visual token in (T, B) order
        hidden[where.to(hidden.device)] = hidden[where.to(hidden.device)] + aligned.to(hidden.device, hidden.dtype)
        return (hidden, *rest) if rest is not None else hidden

    return hook
