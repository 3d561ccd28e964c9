"""Stand-in checkpoints: a directory file-for-file like a published Qwen-Omni checkpoint, generated in code, at the
real widths with the depth cut and random weights.

    relax-gym model fake qwen2.5-omni-3b /tmp/omni3b --layers 1
    write_standin("qwen2.5-omni-3b", "/tmp/omni3b", layers=1)

What is written (the published file names):

- ``config.json``: the full Omni config (``thinker_config``, ``talker_config``, ``token2wav_config`` or
  ``code2wav_config``) as :mod:`~relax_gym.trainer.models.published` holds it, stacks cut to ``layers``;
- ``model-0000k-of-0000N.safetensors`` (N the published shard count) and ``model.safetensors.index.json``, with
  the published tensor names (``thinker.model.layers.0.self_attn.q_proj.weight``, ``thinker.visual.blocks.0...``,
  ``thinker.audio_tower...``, ``thinker.lm_head.weight``, ``talker...``, ``token2wav...``; Qwen3-Omni's experts one
  tensor per expert, ``...mlp.experts.7.gate_proj.weight``). The names come from transformers' own model classes,
  built on the meta device from the config (nothing is allocated), mapped back to the published spelling — the
  inverse of the renames transformers applies when it loads such a checkpoint;
- the tokenizer (:mod:`~relax_gym.trainer.models.qwen_tokenizer`: Qwen's special tokens at their ids, 151,643
  regular tokens), ``special_tokens_map.json``, ``added_tokens.json``, ``chat_template.json``;
- ``preprocessor_config.json`` and ``generation_config.json``; Qwen2.5-Omni's ``spk_dict.pt`` (the talker's
  speaker conditions; random).

``thinker_only=True`` writes the layout of a thinker saved on its own (``Qwen2_5OmniThinkerForConditionalGeneration``
config, tensor names without the ``thinker.`` prefix), which fine-tuning scripts produce.

Weights are drawn per tensor from a generator seeded by ``(seed, name)``: the same call writes the same bytes, in
any order. Matrices ~ N(0, 0.02), biases 0, other vectors (norm scales) 1; bf16 unless asked otherwise, Qwen2.5-Omni's
token2wav in float32 as published. Memory: one shard at a time.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from relax_gym.trainer.models.published import PUBLISHED, published_config
from relax_gym.trainer.models.qwen_tokenizer import write_tokenizer_files

__all__ = ["INDEX_FILE", "published_tensor_shapes", "write_standin"]

INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
INIT_STD = 0.02

_THINKER_CLASS = {"qwen2_5_omni": "Qwen2_5OmniThinkerForConditionalGeneration",
                  "qwen3_omni_moe": "Qwen3OmniMoeThinkerForConditionalGeneration"}
_FULL_CLASS = {"qwen2_5_omni": ("Qwen2_5OmniConfig", "Qwen2_5OmniForConditionalGeneration"),
               "qwen3_omni_moe": ("Qwen3OmniMoeConfig", "Qwen3OmniMoeForConditionalGeneration")}
_THINKER_CONFIG = {"qwen2_5_omni": "Qwen2_5OmniThinkerConfig", "qwen3_omni_moe": "Qwen3OmniMoeThinkerConfig"}

# transformers 5 module names -> the published spelling (inverse of its load-time renames)
_RENAMES = (
    (re.compile(r"^thinker\.model\.language_model\."), "thinker.model."),
    (re.compile(r"^thinker\.model\.visual\."), "thinker.visual."),
    (re.compile(r"^thinker\.model\.audio_tower\."), "thinker.audio_tower."),
)
_FUSED_EXPERTS = re.compile(r"^(?P<stem>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def _meta_state(model_type: str, config: dict[str, Any], thinker_only: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{transformers name: (shape, kind)}`` of the model ``config`` describes, built on the meta device."""
    import transformers

    with torch.device("meta"):
        if thinker_only:
            cfg = getattr(transformers, _THINKER_CONFIG[model_type])(**config["thinker_config"])
            model = getattr(transformers, _THINKER_CLASS[model_type])(cfg)
            prefix = "thinker."
        else:
            cfg_cls, model_cls = _FULL_CLASS[model_type]
            cfg = getattr(transformers, cfg_cls)(**config)
            model = getattr(transformers, model_cls)(cfg)
            prefix = ""
    shapes = {}
    for name, tensor in model.state_dict().items():
        shapes[prefix + name] = tuple(tensor.shape)
    return {k: (v, "") for k, v in shapes.items()}


def _published_names(state: dict[str, tuple[tuple[int, ...], str]]) -> Iterator[tuple[str, tuple[int, ...]]]:
    for name, (shape, _) in state.items():
        for pattern, repl in _RENAMES:
            name = pattern.sub(repl, name)
        fused = _FUSED_EXPERTS.match(name)
        if fused is None:
            yield name, shape
            continue
        stem, experts = fused["stem"], shape[0]
        if fused["kind"] == "gate_up_proj":  # (E, 2I, H) -> per expert gate (I, H) and up (I, H)
            half = shape[1] // 2
            for e in range(experts):
                yield f"{stem}.{e}.gate_proj.weight", (half, shape[2])
                yield f"{stem}.{e}.up_proj.weight", (half, shape[2])
        else:  # (E, H, I) -> per expert down (H, I)
            for e in range(experts):
                yield f"{stem}.{e}.down_proj.weight", (shape[1], shape[2])


def published_tensor_shapes(name: str, layers: int | None = None, *, thinker_only: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor of ``name``'s checkpoint (at ``layers`` depth, full depth when None) with its published name and
    shape, in a stable order."""
    model = PUBLISHED[name]
    config = published_config(name, layers)
    shapes = dict(_published_names(_meta_state(model.family, config, thinker_only)))
    if thinker_only:
        shapes = {k.removeprefix("thinker."): v for k, v in shapes.items()}
    return dict(sorted(shapes.items(), key=lambda kv: _sort_key(kv[0])))


def _sort_key(name: str) -> tuple:
    """Published shards hold tensors in name order with layer numbers compared as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in name.split("."))


def _random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    if len(shape) <= 1:
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))  # the CPU generator keeps 32 bits
    out = torch.empty(shape, dtype=dtype)
    rows = max(1, (1 << 24) // max(1, out[0].numel()))  # fill in slices of ~16 M values: no full-size fp32 copy
    scratch = torch.empty((min(rows, shape[0]), *shape[1:]))  # one fp32 slice, drawn into again and again: no
    for start in range(0, shape[0], rows):                  # fresh 64 MB per slice (the same values, faster)
        block = out[start:start + rows]
        draw = torch.randn(block.shape, generator=gen, out=scratch[:block.shape[0]])
        block.copy_(draw.mul_(INIT_STD))
    return out


def _plan_shards(shapes: dict[str, tuple[int, ...]], shards: int, itemsize: dict[str, int]) -> list[list[str]]:
    """Split tensors (in order) into ``shards`` consecutive groups of similar byte size (never an empty group);
    ``itemsize``: bytes per value of each tensor."""
    names = list(shapes)
    sizes = [itemsize[n] * _numel(shapes[n]) for n in names]
    shards = max(1, min(shards, len(names)))
    total = sum(sizes)
    groups: list[list[str]] = [[] for _ in range(shards)]
    done, g = 0, 0
    for i, (name, size) in enumerate(zip(names, sizes)):
        left_names = len(names) - i
        left_groups = shards - g - 1
        if groups[g] and g < shards - 1 and (done >= total * (g + 1) / shards or left_names <= left_groups):
            g += 1
        groups[g].append(name)
        done += size
    return groups


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def write_standin(name: str, out: str | Path, *, layers: int = 1, seed: int = 0, dtype: str = "bfloat16",
                  thinker_only: bool = False) -> Path:
    """Write the stand-in of published model ``name`` into ``out`` (created; files in it are overwritten)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model = PUBLISHED[name] if name in PUBLISHED else None
    if model is None:
        raise KeyError(f"unknown published model {name!r}; known: {', '.join(sorted(PUBLISHED))}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch_dtype = DTYPES[dtype]
    config = published_config(name, layers)
    shapes = published_tensor_shapes(name, layers, thinker_only=thinker_only)
    wide = () if thinker_only else model.float32_parts
    _write_weights(out, shapes, model.shards, {n: torch.float32 if n.startswith(wide) else torch_dtype for n in shapes}, seed)
    _write_config(out, model.family, config, dtype, thinker_only)
    _write_processor_files(out, model)
    if "spk_dict.pt" in model.extra_files and not thinker_only:
        _write_speakers(out, config, seed)
    return out


def _write_weights(out: Path, shapes: dict[str, tuple[int, ...]], shards: int, dtypes: dict[str, torch.dtype],
                   seed: int) -> None:
    groups = _plan_shards(shapes, shards, {n: torch.empty((), dtype=d).element_size() for n, d in dtypes.items()})
    weight_map: dict[str, str] = {}
    total = 0
    for k, group in enumerate(groups, start=1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: _random_tensor(n, shapes[n], dtypes[n], seed) for n in group}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        os.chmod(out / file, 0o644)  # safetensors writes 0600; published files are world-readable
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({n: file for n in group})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _write_config(out: Path, family: str, config: dict[str, Any], dtype: str, thinker_only: bool) -> None:
    if thinker_only:
        thinker = dict(config["thinker_config"])
        thinker["architectures"] = [_THINKER_CLASS[family]]
        config = thinker
    config = {**config, "torch_dtype": dtype}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_processor_files(out: Path, model: Any) -> None:
    write_tokenizer_files(out, model.special_tokens, model.tokenizer_config, model.chat_template)
    specials = [t for t, _, special in model.special_tokens if special]
    (out / "added_tokens.json").write_text(json.dumps({t: i for t, i, _ in model.special_tokens}, indent=2) + "\n")
    media = model.tokenizer_config.get("extra_special_tokens", {})
    special_map = {"eos_token": model.tokenizer_config["eos_token"], "pad_token": model.tokenizer_config["pad_token"],
                   "additional_special_tokens": [t for t in specials if t not in ("<|endoftext|>", "<|im_end|>")],
                   **media}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps(model.preprocessor, indent=2, sort_keys=True) + "\n")
    if model.video_preprocessor is not None:
        (out / "video_preprocessor_config.json").write_text(json.dumps(model.video_preprocessor, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(model.generation, indent=2) + "\n")


def _write_speakers(out: Path, config: dict[str, Any], seed: int) -> None:
    """Qwen2.5-Omni's ``spk_dict.pt``: per voice, the vocoder's conditioning vector and the talker's start token."""
    gen = torch.Generator().manual_seed(seed)
    mel = int(config["token2wav_config"]["dit_config"]["enc_emb_dim"])
    speakers = {voice: {"cond": torch.randn(mel, generator=gen), "ref_mel": torch.randn(1, 300, 80, generator=gen),
                        "bos_token": bos} for voice, bos in (("Chelsie", 151870), ("Ethan", 151871))}
    torch.save(speakers, out / "spk_dict.pt")
