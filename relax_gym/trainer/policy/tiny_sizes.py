"""The config entries a tiny random thinker takes from ``PolicyConfig`` whatever its family (dense Qwen2.5-Omni or
Qwen3-Omni MoE): decoder, vision tower and audio tower sizes, the tokenizer's vocabulary and special ids, and the
init range. Each family's builder adds what only it has (rope layout, experts, window attention, ...)."""

from __future__ import annotations

from typing import Any

__all__ = ["audio_sizes", "text_sizes", "vision_sizes"]


def text_sizes(cfg: Any, processor: Any) -> dict[str, Any]:
    return dict(
        vocab_size=len(processor.tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=32768,
        initializer_range=cfg.init_range,
        tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=processor.pad_token_id,
        eos_token_id=processor.eos_token_id,
        bos_token_id=None,
    )


def vision_sizes(cfg: Any) -> dict[str, Any]:
    return dict(
        depth=cfg.vision_depth,
        hidden_size=cfg.vision_embed,
        intermediate_size=cfg.vision_intermediate,
        num_heads=cfg.vision_heads,
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        spatial_merge_size=cfg.spatial_merge_size,
        out_hidden_size=cfg.hidden_size,
        initializer_range=cfg.init_range,
    )


def audio_sizes(cfg: Any, processor: Any) -> dict[str, Any]:
    return dict(
        num_mel_bins=processor.feature_extractor.feature_size,
        encoder_layers=cfg.audio_layers,
        encoder_attention_heads=cfg.audio_heads,
        encoder_ffn_dim=cfg.audio_ffn,
        d_model=cfg.audio_d_model,
        output_dim=cfg.hidden_size,
        initializer_range=cfg.init_range,
    )
