"""The policy: a Qwen2.5-Omni *thinker* (text out; image, video and audio in), tiny and random or loaded.

``build_policy(PolicyConfig())`` builds a ~1 M-parameter ``Qwen2_5OmniThinkerForConditionalGeneration`` from
config (no download): vocabulary = our in-code tokenizer, weights drawn with ``init_range`` (0.1: random tiny models
do not learn from the library's 0.02), the multimodal rope sections sized to the head dimension, media token ids
wired to the tokenizer's, and a generation config whose pad / eos are ours, bos None, and whose
``suppress_tokens`` keep the policy from sampling media placeholders (a sampled ``<|IMAGE|>`` breaks the next
forward: "features and tokens do not match"). With ``path`` set it loads a checkpoint directory instead, with the
same code: a thinker saved by ``save_policy`` / ``save_pretrained``, or a full Qwen2.5-Omni / Qwen3-Omni checkpoint
(the thinker's config and weights are taken, talker and vocoder skipped and said once in the log), and its processor
(:class:`OmniProcessor`: the checkpoint's tokenizer, chat template and media limits).

A directory is checked before transformers sees it (:mod:`~relax_gym.trainer.policy.checkpoint_files`): a missing
file, a shard the index names but the directory lacks, a config whose vocabulary, widths or depth do not match the
weights, a tensor the config describes but no file holds (transformers would initialise it at random), a tokenizer
without the media tokens or larger than the embedding — each is one :class:`CheckpointDirError` line naming the file
and the field.

``model.dtype: auto`` (the default) keeps the checkpoint's dtype (``torch_dtype`` of its config.json, else its
weights'; float32 for the tiny random thinker), so a bf16 checkpoint trains, and is saved back, in bf16;
``float32`` / ``bfloat16`` / ``float16`` cast on load. ``save_policy`` writes the weights in the dtype the model
holds and the processor files in the published formats (:meth:`OmniProcessor.save_pretrained`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

from relax_gym.trainer.policy.checkpoint_files import (
    PREPROCESSOR_FILE,
    CheckpointDir,
    CheckpointDirError,
    MissingCheckpointFile,
    check_processor,
    check_tokenizer,
    check_tokenizer_files,
    check_weights,
    read_checkpoint_dir,
    read_json,
    thinker_config as checkpoint_thinker_config,
)
from relax_gym.trainer.policy.config import DTYPES, PolicyConfig
from relax_gym.trainer.policy.moe import MoEThinker, moe_thinker_config
from relax_gym.trainer.policy.processor import VIDEO_PREPROCESSOR_CONFIG, OmniProcessor, build_processor
from relax_gym.trainer.policy.requirements import require_transformers
from relax_gym.trainer.policy.tiny_sizes import audio_sizes, text_sizes, vision_sizes

__all__ = ["CheckpointDirError", "PolicyConfig", "build_policy", "load_processor", "mrope_sections", "save_policy", "thinker_config"]

log = logging.getLogger(__name__)

THINKER_CLASSES = {"qwen2_5_omni": Qwen2_5OmniThinkerForConditionalGeneration, "qwen3_omni_moe": MoEThinker}
AUDIO_TOKEN_RULE = {"qwen2_5_omni": "qwen2_5_omni", "qwen3_omni_moe": "qwen3_omni"}
_announced: set[str] = set()  # checkpoint directories whose skipped parts were logged (once per process)


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


def build_policy(cfg: PolicyConfig | None = None, **overrides: Any) -> tuple[Qwen2_5OmniThinkerForConditionalGeneration, OmniProcessor]:
    """``(model, processor)``: a tiny random thinker (``cfg.path`` None) or the checkpoint at ``cfg.path``."""
    require_transformers()
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
    """Check the directory (files, config against weights, tokenizer, processor), then load the thinker."""
    d = read_checkpoint_dir(cfg.path, cfg.family)  # type: ignore[arg-type]
    config = checkpoint_thinker_config(d)
    check_weights(d, config)
    processor = load_processor(d, config)
    dtype = _load_dtype(cfg, d)
    _announce_skipped(d)
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype, "output_loading_info": True}
    if d.full:  # the full model: the thinker's tensors carry the thinker. prefix
        kwargs["key_mapping"] = {r"^thinker\.": ""}
    model, info = THINKER_CLASSES[cfg.family].from_pretrained(str(d.path), **kwargs)
    missing = sorted(set(info.get("missing_keys") or ()) - {n for n, _ in model.named_buffers()})
    if missing:  # check_weights saw every tensor: this is a guard against a transformers rename it does not know
        raise CheckpointDirError(f"{d.path}: transformers loaded no tensor for {len(missing)} parameter(s), e.g. "
                                 f"{missing[0]}; they would be random")
    if getattr(model.config, "vision_start_token_id", None) is None:
        _wire_token_ids(model.config, processor)
    model.generation_config = _loaded_generation_config(d.path, processor)
    model.eval()
    return model, processor


def load_processor(d: CheckpointDir, config: Any) -> OmniProcessor:
    """The checkpoint's :class:`OmniProcessor` (tokenizer, chat template, media limits), checked against the model:
    tokenizer files present, no token beyond the embedding, media tokens with the config's ids, patch and mel sizes
    as the towers'. Raises :class:`CheckpointDirError` naming the file."""
    from transformers import AutoTokenizer

    check_tokenizer_files(d.path)
    if not (d.path / PREPROCESSOR_FILE).is_file():
        raise MissingCheckpointFile(f"{d.path / PREPROCESSOR_FILE}: missing: the image and audio settings (patch "
                                    "size, min / max pixels, mel bins) are not known")
    for name in (PREPROCESSOR_FILE, VIDEO_PREPROCESSOR_CONFIG):
        if (d.path / name).is_file():
            read_json(d.path / name)  # a syntax error names its file, line and column
    try:
        # config= spares AutoTokenizer building the full Omni config (whose talker part makes transformers warn)
        tokenizer = AutoTokenizer.from_pretrained(str(d.path), config=config)
    except Exception as exc:  # a corrupt or foreign tokenizer file: name it instead of a transformers traceback
        name = "tokenizer.json" if (d.path / "tokenizer.json").is_file() else "vocab.json"
        raise CheckpointDirError(f"{d.path / name}: transformers' AutoTokenizer cannot read the tokenizer "
                                 f"({type(exc).__name__}: {str(exc)[:200]})".replace("\n", " ")) from exc
    check_tokenizer(d, config, tokenizer)
    try:
        processor = OmniProcessor.from_pretrained(d.path, tokenizer=tokenizer,
                                                  audio_token_rule=AUDIO_TOKEN_RULE[d.family.name])
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointDirError(f"{d.path / PREPROCESSOR_FILE}: the processor cannot be built from it "
                                 f"({type(exc).__name__}: {str(exc)[:200]})".replace("\n", " ")) from exc
    check_processor(d, config, processor)
    return processor


def _load_dtype(cfg: PolicyConfig, d: CheckpointDir) -> torch.dtype:
    """``model.dtype``, or for ``auto`` the checkpoint's (as
    :func:`~relax_gym.trainer.policy.checkpoint_files.checkpoint_dtype` decides it; float64 -> float32)."""
    stored = d.config_dtype or d.weights_dtype or "float32"
    if cfg.dtype == "auto":
        return DTYPES.get(stored, torch.float32)
    if cfg.dtype != stored:
        log.info("%s is stored in %s; model.dtype=%s casts it on load (and checkpoints of this run are written in %s; "
                 "model.dtype=auto keeps %s)", d.path, stored, cfg.dtype, cfg.dtype, stored)
    return DTYPES[cfg.dtype]


def _announce_skipped(d: CheckpointDir) -> None:
    """Say once per process and directory which parts of a full checkpoint are not loaded."""
    key = str(d.path.resolve())
    if not d.full or key in _announced:
        return
    _announced.add(key)
    parts = sorted(set(d.family.other_parts) | set(d.skipped))
    skipped = ", ".join(f"{p} ({d.skipped.get(p, 0)} tensors)" for p in parts)
    log.warning("%s: a full %s checkpoint; loading its thinker (%d tensors) and skipping %s", d.path,
                d.family.full_type, len(d.thinker), skipped)


def _loaded_generation_config(path: Path, processor: OmniProcessor) -> GenerationConfig:
    """The checkpoint's generation config (sampling defaults, eos ids) with our pad, no bos, and the control tokens
    suppressed; ours when it has none."""
    generation = _generation_config(processor)
    if (path / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(str(path))
        generation.pad_token_id = processor.pad_token_id
        generation.eos_token_id = generation.eos_token_id if generation.eos_token_id is not None else processor.eos_token_id
        generation.bos_token_id = None
        generation.suppress_tokens = sorted(set(generation.suppress_tokens or []) | set(processor.control_token_ids))
    return generation


def save_policy(model: Qwen2_5OmniThinkerForConditionalGeneration, processor: OmniProcessor, directory: str | Path) -> Path:
    """Write model (config, weights, generation config) and processor to ``directory``; ``build_policy(
    PolicyConfig(path=directory))`` loads them back, and so do transformers' thinker class, ``AutoTokenizer`` and
    the official image processor / feature extractor. The weights keep the dtype the model holds (a bf16 checkpoint
    loaded with ``model.dtype: auto`` is written back in bf16); the layout is the thinker's own (``config.json`` of
    the thinker, tensors without the ``thinker.`` prefix), as ``save_pretrained`` writes it."""
    path = Path(directory)
    model.save_pretrained(str(path))
    processor.save_pretrained(path)
    return path
