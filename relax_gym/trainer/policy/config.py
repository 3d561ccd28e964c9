"""What policy to build or load (:class:`PolicyConfig`), apart from the model code: a role that only reads the
config (the env workers, the advantages role) does not import transformers' modelling classes with it."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.trainer.policy.tokenizer import DEFAULT_VOCAB_SIZE

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyConfig(BaseModel):
    """What policy to build. Sizes apply only when ``path`` is None (a tiny random thinker)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # qwen2_5_omni: dense Qwen2.5-Omni thinker; qwen3_omni_moe: Qwen3-Omni MoE thinker (policy/moe.py, routing replay)
    family: Literal["qwen2_5_omni", "qwen3_omni_moe"] = "qwen2_5_omni"
    # a checkpoint directory (thinker or full Qwen-Omni) with its processor files; its model_type must be this family's
    # (a qwen3_omni_moe directory needs family qwen3_omni_moe: the family also picks routing replay and conversion)
    path: str | None = None
    # a named base (relax_gym/trainer/base/spec.py): the run starts from that base, built into the cache on first use
    # with this section's sizes (the trainer turns it into ``path`` before anything loads the policy)
    base: str | None = None
    # auto: the checkpoint's own dtype (config.json torch_dtype, else its weights'); float32 for the tiny random thinker
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    seed: int = 0  # weight init seed (random thinker only)
    init_range: float = Field(default=0.1, gt=0)
    # text decoder
    hidden_size: int = Field(default=128, gt=0)
    intermediate_size: int = Field(default=256, gt=0)
    num_layers: int = Field(default=2, gt=0)
    num_heads: int = Field(default=4, gt=0)
    num_kv_heads: int = Field(default=2, gt=0)
    rope_theta: float = 10_000.0
    tie_embeddings: bool = True
    vocab_size: int = Field(default=DEFAULT_VOCAB_SIZE, ge=300)  # BPE training target; the model gets the real size
    # vision encoder (image and video)
    vision_depth: int = Field(default=2, gt=0)
    vision_embed: int = Field(default=64, gt=0)
    vision_heads: int = Field(default=4, gt=0)
    vision_intermediate: int = Field(default=128, gt=0)
    patch_size: int = Field(default=8, gt=0)
    temporal_patch_size: int = Field(default=2, gt=0)
    spatial_merge_size: int = Field(default=2, gt=0)
    # audio encoder
    audio_layers: int = Field(default=2, gt=0)
    audio_d_model: int = Field(default=64, gt=0)
    audio_heads: int = Field(default=4, gt=0)
    audio_ffn: int = Field(default=128, gt=0)
    # processor (random thinker only; a checkpoint brings its own)
    min_pixels: int = Field(default=16 * 16 * 4, gt=0)  # per image / frame, before patching
    max_pixels: int = Field(default=128 * 128, gt=0)
    video_max_pixels: int = Field(default=64 * 64, gt=0)
    audio_chunk_seconds: int = Field(default=30, gt=0)  # features padded to this (Whisper/Qwen: 30 s)
    # mixture of experts (family qwen3_omni_moe only): every decoder layer routes each token to top_k of num_experts
    num_experts: int = Field(default=8, ge=2)
    moe_top_k: int = Field(default=2, ge=1)
    moe_intermediate_size: int = Field(default=64, gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> PolicyConfig:
        if self.path is not None and self.base is not None:
            raise ValueError(f"name either model.path ({self.path!r}) or model.base ({self.base!r}), not both (a recipe "
                             "that names a base starts from a checkpoint with model.path=DIR model.base=null)")
        if self.path is None:
            if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
                raise ValueError("hidden_size must divide by num_heads and num_heads by num_kv_heads")
            if (self.hidden_size // self.num_heads) % 8:
                raise ValueError("the text head dimension (hidden_size / num_heads) must be a multiple of 8 (3-D rope sections)")
            if self.vision_embed % self.vision_heads or (self.vision_embed // self.vision_heads) % 4:
                raise ValueError("the vision head dimension must be a multiple of 4 (axial 2-D rope)")
            if self.audio_d_model % self.audio_heads:
                raise ValueError("audio_d_model must divide by audio_heads")
        if self.moe_top_k > self.num_experts:
            raise ValueError(f"moe_top_k ({self.moe_top_k}) must not exceed num_experts ({self.num_experts})")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the policy is built or loaded in (``auto``: the checkpoint's, as
        :func:`~relax_gym.trainer.policy.checkpoint_files.checkpoint_dtype` reads it; float32 without a checkpoint)."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if self.path is None:
            return torch.float32
        from relax_gym.trainer.policy.checkpoint_files import checkpoint_dtype  # transformers' model classes: on use

        return DTYPES.get(checkpoint_dtype(self.path), torch.float32)


def routing_dims(cfg: PolicyConfig) -> tuple[int, int] | None:
    """``(MoE layers, experts per token)`` of the policy ``cfg`` describes (a ``PolicyConfig``), None for a dense one.
    For a checkpoint (``cfg.path``) the sizes come from its config.json."""
    if cfg.family != "qwen3_omni_moe":
        return None
    if cfg.path is None:
        return int(cfg.num_layers), int(cfg.moe_top_k)
    from transformers import Qwen3OmniMoeThinkerConfig  # the config class only, not the model's code

    text = Qwen3OmniMoeThinkerConfig.from_pretrained(cfg.path).get_text_config()
    sparse = [i for i in range(text.num_hidden_layers) if i not in (text.mlp_only_layers or [])
              and text.num_experts > 0 and (i + 1) % text.decoder_sparse_step == 0]
    return len(sparse), int(text.num_experts_per_tok)
