"""The mixture-of-experts policy: a tiny Qwen3-Omni MoE *thinker* (text out; image, video and audio in).

``PolicyConfig(family="qwen3_omni_moe")`` makes :func:`~relax_gym.trainer.policy.model.build_policy` build a
``Qwen3OmniMoeThinkerForConditionalGeneration`` from the config below instead of the dense Qwen2.5-Omni thinker:
the same tokenizer, processor and sizes (hidden size, heads, layers, the vision and audio towers), plus every text
decoder layer a sparse MoE block whose router sends each token to ``moe_top_k`` of ``num_experts`` experts
(softmax over the router logits, top-k, renormalised: ``norm_topk_prob``). The processor is ours unchanged except
for the audio placeholder count, which follows Qwen3-Omni's audio tower (``audio_token_rule="qwen3_omni"``: 13
tokens per second instead of 25). The vision tower is Qwen3-VL's (learned position embeddings interpolated to any
grid, one "deepstack" level injected into the first decoder layer); it reads the processor's patch rows as they are.

Routing is recorded and replayed through :mod:`~relax_gym.trainer.policy.routers`.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

from relax_gym.trainer.policy.tiny_sizes import audio_sizes, text_sizes, vision_sizes

__all__ = ["MoEThinker", "moe_thinker_config"]

#: The model class of family ``qwen3_omni_moe``.
MoEThinker = Qwen3OmniMoeThinkerForConditionalGeneration


def moe_thinker_config(cfg: Any, processor: Any, rope_sections: list[int]) -> Qwen3OmniMoeThinkerConfig:
    """A tiny Qwen3-Omni MoE thinker config from a :class:`~relax_gym.trainer.policy.PolicyConfig` ``cfg``; the
    vocabulary, pad and eos are the processor's tokenizer's, ``rope_sections`` the (t, h, w) split of the text rotary
    frequencies. (The media token ids are wired by the caller, as for the dense thinker.)"""
    head_dim = cfg.hidden_size // cfg.num_heads
    grid_side = max(4, (cfg.max_pixels ** 0.5) // cfg.patch_size)  # learned vision positions: a square grid
    return Qwen3OmniMoeThinkerConfig(
        text_config={
            **text_sizes(cfg, processor),
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.moe_top_k,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "head_dim": head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta, "mrope_section": rope_sections,
                                "mrope_interleaved": True},
        },
        vision_config={**vision_sizes(cfg), "num_position_embeddings": int(grid_side) ** 2, "deepstack_visual_indexes": [0]},
        audio_config={**audio_sizes(cfg, processor), "downsample_hidden_size": max(8, cfg.audio_d_model // 2)},
        initializer_range=cfg.init_range,
        tie_word_embeddings=cfg.tie_embeddings,
    )
