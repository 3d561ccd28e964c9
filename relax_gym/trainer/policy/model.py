"""The policy: a Qwen2.5-Omni *thinker* (text out; image, video and audio in), tiny and random or loaded.

``build_policy(PolicyConfig())`` builds a ~1 M-parameter ``Qwen2_5OmniThinkerForConditionalGeneration`` from
config (no download): vocabulary = our in-code tokenizer, weights drawn with ``init_range`` (0.1: random tiny models
do not learn from the library's 0.02), the multimodal rope sections sized to the head dimension, media token ids
wired to the tokenizer's, and a generation config whose pad / eos are ours, bos None, and whose
``suppress_tokens`` keep the policy from sampling media placeholders (a sampled ``<|IMAGE|>`` breaks the next
forward: "features and tokens do not match"). With ``path`` set it loads a checkpoint directory instead, with the
same code: a thinker saved by ``save_policy`` / ``save_pretrained``, or a full Qwen2.5-Omni checkpoint (the thinker's
weights are taken, talker and vocoder skipped), and its processor (:class:`OmniProcessor`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import GenerationConfig, Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration, WhisperFeatureExtractor

from relax_gym.trainer.policy.moe import MoEThinker, moe_thinker_config
from relax_gym.trainer.policy.processor import OmniProcessor
from relax_gym.trainer.policy.tiny_sizes import audio_sizes, text_sizes, vision_sizes
from relax_gym.trainer.policy.tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer

__all__ = ["PolicyConfig", "build_policy", "mrope_sections", "save_policy", "thinker_config"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
THINKER_CLASSES = {"qwen2_5_omni": Qwen2_5OmniThinkerForConditionalGeneration, "qwen3_omni_moe": MoEThinker}
CHECKPOINT_TYPES = {"qwen2_5_omni": "qwen2_5_omni_thinker", "qwen3_omni_moe": "qwen3_omni_moe_thinker"}


class PolicyConfig(BaseModel):
    """What policy to build. Sizes apply only when ``path`` is None (a tiny random thinker)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # qwen2_5_omni: dense Qwen2.5-Omni thinker; qwen3_omni_moe: Qwen3-Omni MoE thinker (policy/moe.py, routing replay)
    family: Literal["qwen2_5_omni", "qwen3_omni_moe"] = "qwen2_5_omni"
    path: str | None = None  # a checkpoint directory (thinker or full Qwen2.5-Omni) with its processor files
    # a named base (relax_gym/trainer/base/spec.py): the run starts from that base, built into the cache on first use
    # with this section's sizes (the trainer turns it into ``path`` before anything loads the policy)
    base: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
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
        return DTYPES[self.dtype]


def mrope_sections(head_dim: int) -> list[int]:
    """The (temporal, height, width) split of the rotary frequencies; sums to ``head_dim // 2`` in Qwen's
    proportions (128 → [16, 24, 24]; 32 → [4, 6, 6])."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def thinker_config(cfg: PolicyConfig, processor: OmniProcessor) -> Qwen2_5OmniThinkerConfig:
    """A tiny thinker config from ``cfg`` whose vocabulary and media token ids are the processor's tokenizer's."""
    head_dim = cfg.hidden_size // cfg.num_heads
    config = Qwen2_5OmniThinkerConfig(
        text_config={**text_sizes(cfg, processor),
                     "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta, "mrope_section": mrope_sections(head_dim)}},
        vision_config={**vision_sizes(cfg),
                       "window_size": cfg.patch_size * cfg.spatial_merge_size * 4,  # 4x4 merged tokens per attention window
                       "fullatt_block_indexes": [cfg.vision_depth - 1]},
        audio_config=audio_sizes(cfg, processor),
        initializer_range=cfg.init_range,
        tie_word_embeddings=cfg.tie_embeddings,
    )
    _wire_token_ids(config, processor)
    return config


def _wire_token_ids(config: Qwen2_5OmniThinkerConfig, processor: OmniProcessor) -> None:
    """Media token ids on the thinker config (``vision_start_token_id`` is read by ``get_rope_index`` but is no
    declared field of the 5.24 thinker config: without it a config built from scratch fails on the first image)."""
    config.image_token_id = processor.image_token_id
    config.video_token_id = processor.video_token_id
    config.audio_token_id = processor.audio_token_id
    config.vision_start_token_id = processor.vision_bos_token_id
    config.vision_end_token_id = processor.vision_eos_token_id
    config.audio_start_token_id = processor.audio_bos_token_id
    config.audio_end_token_id = processor.audio_eos_token_id


def _generation_config(processor: OmniProcessor) -> GenerationConfig:
    return GenerationConfig(
        pad_token_id=processor.pad_token_id,
        eos_token_id=processor.eos_token_id,
        bos_token_id=None,
        suppress_tokens=processor.control_token_ids,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=64,
    )


def build_processor(cfg: PolicyConfig) -> OmniProcessor:
    tokenizer = build_tokenizer(cfg.vocab_size)
    audio_rule = "qwen3_omni" if cfg.family == "qwen3_omni_moe" else "qwen2_5_omni"
    return OmniProcessor(
        tokenizer,
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        merge_size=cfg.spatial_merge_size,
        min_pixels=cfg.min_pixels,
        max_pixels=cfg.max_pixels,
        video_min_pixels=cfg.min_pixels,
        video_max_pixels=cfg.video_max_pixels,
        feature_extractor=WhisperFeatureExtractor(feature_size=128, chunk_length=cfg.audio_chunk_seconds),
        audio_token_rule=audio_rule,
    )


def build_policy(cfg: PolicyConfig | None = None, **overrides: Any) -> tuple[Qwen2_5OmniThinkerForConditionalGeneration, OmniProcessor]:
    """``(model, processor)``: a tiny random thinker (``cfg.path`` None) or the checkpoint at ``cfg.path``."""
    cfg = (cfg or PolicyConfig()).model_copy(update=overrides) if overrides else (cfg or PolicyConfig())
    if cfg.base is not None:
        raise ValueError(f"model.base={cfg.base!r} is not built yet: the trainers turn it into a checkpoint path "
                         "first (relax_gym.trainer.run.base_model.resolve_base)")
    if cfg.path is not None:
        return _load(cfg)
    processor = build_processor(cfg)
    if cfg.family == "qwen3_omni_moe":
        config = moe_thinker_config(cfg, processor, mrope_sections(cfg.hidden_size // cfg.num_heads))
        _wire_token_ids(config, processor)
    else:
        config = thinker_config(cfg, processor)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = THINKER_CLASSES[cfg.family](config)
    model.generation_config = _generation_config(processor)
    model.to(cfg.torch_dtype)
    model.eval()
    return model, processor


def _load(cfg: PolicyConfig) -> tuple[Qwen2_5OmniThinkerForConditionalGeneration, OmniProcessor]:
    path = Path(cfg.path)  # type: ignore[arg-type]
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in {path}: not a model checkpoint directory")
    model_type = json.loads(config_file.read_text()).get("model_type")
    processor = OmniProcessor.from_pretrained(path)
    kwargs: dict[str, Any] = {"dtype": cfg.torch_dtype}
    if model_type == "qwen2_5_omni" and cfg.family == "qwen2_5_omni":  # the full model: keep the thinker's weights only
        from transformers import Qwen2_5OmniConfig

        kwargs["config"] = Qwen2_5OmniConfig.from_pretrained(str(path)).thinker_config
        kwargs["key_mapping"] = {r"^thinker\.": ""}
    elif model_type != CHECKPOINT_TYPES[cfg.family]:
        raise ValueError(f"{path} holds a {model_type!r} model; family {cfg.family!r} loads {CHECKPOINT_TYPES[cfg.family]!r} checkpoints")
    model = THINKER_CLASSES[cfg.family].from_pretrained(str(path), **kwargs)
    if getattr(model.config, "vision_start_token_id", None) is None:
        _wire_token_ids(model.config, processor)
    if model.config.get_text_config().vocab_size < len(processor.tokenizer):
        raise ValueError(f"the tokenizer ({len(processor.tokenizer)} tokens) is larger than the model's vocabulary")
    generation = _generation_config(processor)
    saved = path / "generation_config.json"
    if saved.is_file():
        generation = GenerationConfig.from_pretrained(str(path))
        generation.pad_token_id = processor.pad_token_id
        generation.eos_token_id = generation.eos_token_id if generation.eos_token_id is not None else processor.eos_token_id
        generation.bos_token_id = None
        generation.suppress_tokens = sorted(set(generation.suppress_tokens or []) | set(processor.control_token_ids))
    model.generation_config = generation
    model.eval()
    return model, processor


def save_policy(model: Qwen2_5OmniThinkerForConditionalGeneration, processor: OmniProcessor, directory: str | Path) -> Path:
    """Write model (config, weights, generation config) and processor to ``directory``; ``build_policy(
    PolicyConfig(path=directory))`` loads them back."""
    path = Path(directory)
    model.save_pretrained(str(path))
    processor.save_pretrained(path)
    return path
