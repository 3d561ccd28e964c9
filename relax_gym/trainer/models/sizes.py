"""Sizes before a user books GPUs: parameters per part, bytes per rank of a Megatron layout, KV cache per token.

    report = size_report("qwen2.5-omni-7b", tp=2)          # a published name, a checkpoint directory,
    print(format_report(report))                            # a config.json path or a config dict

The CLI (``relax-gym model sizes NAME_OR_DIR --tp 2 --pp 1 --ep 1 --dp 1 --dtype bfloat16
[--distributed-optimizer] [--optimizer mixed|plain]``) is one call: ``print(format_report(size_report(source,
tp=..., pp=..., ep=..., dp=..., dtype=..., distributed_optimizer=..., optimizer=...)))``; a ``ValueError`` /
``FileNotFoundError`` / ``KeyError`` from it is the one line to show the user.

What it counts, at the depth the config gives (the published configs are full depth), with nothing allocated:

- **parameters per part**, exactly: transformers' thinker class (and talker, token2wav / code2wav) instantiated on
  the meta device from the config, ``numel`` summed per part of the parameter names (:func:`count_thinker`). The
  thinker is what the trainer trains; the talker and the vocoder are listed as "not trained". The text decoder is
  split into embedding, lm_head (0 when tied), attention, dense MLP, routed experts, shared experts, router and
  norms. :func:`closed_form` gives the thinker's parts again from the widths alone (our own formulas); the tests
  hold both equal for the three published models.
- **bytes per rank** of a tensor x pipeline x expert x data parallel layout, by the rules of our megatron backend
  (``relax_gym/trainer/actors/megatron/``): attention (fused qkv: column parallel, biases split with it; output
  projection: row parallel) and MLP matrices split over ``tp``; norms and the MoE router replicated; the vocabulary
  of the embedding and the output layer split over ``tp`` after padding it to a multiple of lcm(128, tp)
  (``shard.padded_vocab``); decoder layers split evenly over ``pp`` stages (megatron-core refuses an uneven split);
  the embedding, the vision tower and the audio tower on stage 0 -- the towers whole on every tensor rank
  (``rank_actor.py``: replicated, as Relax places them) -- and the final norm and the output layer on the last stage
  (with tied embeddings and ``pp > 1`` the last stage holds its own copy of the table, which AdamW steps too); the
  experts split over ``ep`` and each expert's matrices over the expert tensor parallel size, which megatron-core
  sets to ``tp`` (``moe.py`` leaves it unset). Every tensor and expert rank of a stage holds the same amount, so
  the largest rank is the largest stage's.
- **bytes per parameter**: weights in the train dtype; gradients in the same dtype (the actor's ``p.grad`` is in
  the parameters' dtype: it runs plain ``torch.optim.AdamW`` over the model, not Megatron's DDP with fp32 main
  grads); the optimizer as ``optimizer="mixed"`` (default: Megatron's mixed-precision optimizer, what a GPU run
  should use -- fp32 master weights when the weights are not fp32, 4 B, and Adam's two moments in fp32, 8 B) or
  ``"plain"`` (what the actor does today: torch AdamW's moments in the weight dtype, no master copy).
  ``distributed_optimizer=True`` (ZeRO-1) divides the master weights and moments over the data-parallel ranks
  (experts over the expert data-parallel ranks, ``dp / ep``). Activations and temporary buffers are not counted.
- **KV cache per token** for inference: 2 (K, V) x layers x kv heads x head dim x dtype bytes; per tensor rank of
  the engine the kv heads are split over ``tp``, and replicated (one per rank) when ``tp`` exceeds them.

:func:`predict_from_standin` is the check of the issue ("the stand-ins' measured sizes scaled by depth"): it reads a
stand-in directory's safetensors headers (no tensor data), counts each part per layer and scales the layers to the
full depth; it must give the report's figures exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# the vocabulary padding of the megatron backend, the same function (shard.py imports only torch at module level)
from relax_gym.trainer.actors.megatron.shard import VOCAB_MULTIPLE, padded_vocab

__all__ = ["DTYPE_BYTES", "Counted", "Layout", "RankBytes", "SizeReport", "VOCAB_MULTIPLE", "classify",
           "closed_form", "count_thinker", "format_report", "kv_cache_bytes_per_token", "load_config",
           "measure_checkpoint", "padded_vocab", "predict_from_standin", "size_report", "TEXT_PARTS", "TRAINED_PARTS"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
INDEX_FILE = "model.safetensors.index.json"

TEXT_PARTS = ("text.embedding", "text.lm_head", "text.attention", "text.mlp", "text.experts", "text.shared_experts",
              "text.router", "text.norms")
TRAINED_PARTS = (*TEXT_PARTS, "vision", "audio")
_TP_SPLIT = ("text.attention", "text.mlp", "text.shared_experts")  # column / row parallel: 1/tp on each tensor rank
_REPLICATED = ("text.router", "text.norms")

_LABELS = {"text.embedding": "embedding", "text.lm_head": "lm_head", "text.attention": "attention",
           "text.mlp": "dense MLP", "text.experts": "routed experts", "text.shared_experts": "shared experts",
           "text.router": "router", "text.norms": "norms", "vision": "vision tower", "audio": "audio tower"}


@dataclass(frozen=True)
class _Family:
    full_config: str
    thinker_config: str
    thinker: str
    talker: str
    vocoder: str  # the vocoder's attribute in the full model and ``<vocoder>_config`` in config.json
    vocoder_class: str


_FAMILIES = {
    "qwen2_5_omni": _Family("Qwen2_5OmniConfig", "Qwen2_5OmniThinkerConfig",
                            "Qwen2_5OmniThinkerForConditionalGeneration", "Qwen2_5OmniTalkerForConditionalGeneration",
                            "token2wav", "Qwen2_5OmniToken2WavModel"),
    "qwen3_omni_moe": _Family("Qwen3OmniMoeConfig", "Qwen3OmniMoeThinkerConfig",
                              "Qwen3OmniMoeThinkerForConditionalGeneration",
                              "Qwen3OmniMoeTalkerForConditionalGeneration", "code2wav", "Qwen3OmniMoeCode2Wav"),
}


# -- where a config comes from --------------------------------------------------------------------------------------

def load_config(source: str | Path | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(label, config.json dict)`` of a config dict, a checkpoint directory, a ``config.json`` path or a published
    model name (:data:`~relax_gym.trainer.models.published.PUBLISHED`)."""
    if isinstance(source, Mapping):
        return str(source.get("_name_or_path") or source.get("model_type", "config")), dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (a checkpoint directory holds its config.json)")
    if path.is_file():
        try:
            return str(source), json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
    from relax_gym.trainer.models.published import PUBLISHED, published_config

    if str(source) in PUBLISHED:
        return PUBLISHED[str(source)].repo, published_config(str(source))
    raise FileNotFoundError(f"{source}: not a checkpoint directory, a config.json file or a published model name "
                            f"({', '.join(sorted(PUBLISHED))})")


def _family(config: Mapping[str, Any]) -> tuple[str, bool]:
    """``(family, is the full Omni config)``; a thinker config (saved on its own) is not full."""
    kind = str(config.get("model_type") or "")
    if not kind and isinstance(config.get("thinker_config"), Mapping):
        kind = str(config["thinker_config"].get("model_type") or "").removesuffix("_thinker")
    for family in _FAMILIES:
        if kind == family:
            return family, True
        if kind == f"{family}_thinker":
            return family, False
    known = ", ".join(f"{f}, {f}_thinker" for f in _FAMILIES)
    raise ValueError(f"config.json model_type={kind!r}: the size report knows {known}")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' config checks warn about the published configs' token ids (talker vocabularies); not ours
    to show in a size report."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


@dataclass(frozen=True)
class _Configs:
    """A config.json as transformers' config objects, with the raw dict of each (the count caches' keys)."""

    family: str
    thinker: Any  # transformers thinker config
    talker: Any | None  # transformers talker config (full Omni configs only)
    vocoder: Any | None
    raw: dict[str, Mapping[str, Any]]  # "thinker", "talker", "token2wav" / "code2wav" -> the config.json dict


def _configs(config: Mapping[str, Any]) -> _Configs:
    import transformers

    family, full = _family(config)
    spec = _FAMILIES[family]
    thinker_raw = config["thinker_config"] if full else config
    raw = {"thinker": thinker_raw}
    talker = vocoder = None
    with _quiet_transformers():
        thinker = getattr(transformers, spec.thinker_config)(**thinker_raw)
        if full and ("talker_config" in config or f"{spec.vocoder}_config" in config):
            cfg = getattr(transformers, spec.full_config)(**config)
            if "talker_config" in config:
                talker, raw["talker"] = cfg.talker_config, config["talker_config"]
            if f"{spec.vocoder}_config" in config:
                vocoder, raw[spec.vocoder] = getattr(cfg, f"{spec.vocoder}_config"), config[f"{spec.vocoder}_config"]
    return _Configs(family, thinker, talker, vocoder, raw)


# -- parameter names -> parts -----------------------------------------------------------------------------------------

_TEXT_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")
_STACKS = ((re.compile(r"^visual\.blocks\.(\d+)\."), "vision", "vision"),
           (re.compile(r"^visual\.merger_list\.(\d+)\."), "vision", "deepstack"),
           (re.compile(r"^audio_tower\.layers\.(\d+)\."), "audio", "audio"))
_NORM = re.compile(r"(^|\.|_)(layernorm|norm|q_norm|k_norm)\.")


@dataclass(frozen=True)
class Slot:
    """Where one thinker tensor belongs: its part, and the repeated stack item (layer, block) it is in, if any."""

    part: str
    stack: str | None = None  # "text" (decoder layers), "vision" (blocks), "deepstack" (mergers), "audio" (layers)
    index: int | None = None


def _text_layer_part(rest: str) -> str:
    if _NORM.search(rest):
        return "text.norms"
    if rest.startswith("self_attn."):
        return "text.attention"
    if rest.startswith("mlp.experts."):
        return "text.experts"
    if rest.startswith(("mlp.gate.", "mlp.shared_expert_gate.")):
        return "text.router"
    if rest.startswith("mlp.shared_expert."):
        return "text.shared_experts"
    if rest.startswith("mlp."):
        return "text.mlp"
    return "other"


def classify(name: str) -> Slot:
    """The part of a thinker tensor, under transformers 5's names (``model.language_model.layers.0...``) or the
    published ones (``thinker.model.layers.0...``, ``thinker.visual...``; no ``thinker.`` when saved on its own)."""
    n = name.removeprefix("thinker.").removeprefix("model.").removeprefix("language_model.")
    if n.startswith("embed_tokens."):
        return Slot("text.embedding")
    if n.startswith("lm_head."):
        return Slot("text.lm_head")
    if n.startswith("norm."):
        return Slot("text.norms")
    m = _TEXT_LAYER.match(n)
    if m is not None:
        return Slot(_text_layer_part(m.group(2)), "text", int(m.group(1)))
    for pattern, part, stack in _STACKS:
        m = pattern.match(n)
        if m is not None:
            return Slot(part, stack, int(m.group(1)))
    if n.startswith("visual."):
        return Slot("vision")
    if n.startswith("audio_tower."):
        return Slot("audio")
    return Slot("other")


@dataclass(frozen=True)
class Counted:
    """A thinker's parameters by part: totals, the part outside the repeated stacks, and each stack item's count."""

    parts: dict[str, int]
    fixed: dict[str, int]
    items: dict[tuple[str, str], tuple[int, ...]]  # (part, stack) -> params of item 0, 1, ... (layers, blocks)

    @classmethod
    def of(cls, named: Iterable[tuple[str, int]]) -> Counted:
        parts = {p: 0 for p in TRAINED_PARTS}
        fixed = {p: 0 for p in TRAINED_PARTS}
        per: dict[tuple[str, str], dict[int, int]] = {}
        for name, numel in named:
            slot = classify(name)
            parts[slot.part] = parts.get(slot.part, 0) + numel
            if slot.stack is None:
                fixed[slot.part] = fixed.get(slot.part, 0) + numel
            else:
                counts = per.setdefault((slot.part, slot.stack), {})
                counts[slot.index] = counts.get(slot.index, 0) + numel
        items = {}
        for key, counts in per.items():
            if sorted(counts) != list(range(len(counts))):
                raise ValueError(f"{key[1]} items of {key[0]} are numbered {sorted(counts)}, not 0..{len(counts) - 1}")
            items[key] = tuple(counts[i] for i in range(len(counts)))
        return cls(parts, fixed, items)

    def stack_items(self, stack: str) -> int:
        """How many items (layers, blocks) of ``stack`` the counted tensors hold."""
        return max((len(v) for (_, s), v in self.items.items() if s == stack), default=0)

    def layer_sum(self, part: str, first: int, stop: int) -> int:
        """Params of ``part`` in decoder layers ``first .. stop - 1``."""
        return sum(self.items.get((part, "text"), ())[first:stop])


def _meta_named(model_class: str, config: Any, prefix: str = "") -> list[tuple[str, int]]:
    import torch
    import transformers

    with _quiet_transformers(), torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    # named_parameters drops the second name of a tied weight: a tied lm_head counts 0
    return [(prefix + n, p.numel()) for n, p in model.named_parameters()]


_COUNTS: dict[tuple[str, str], Any] = {}  # (model class, its config.json dict as JSON) -> its counts


def _memo(model_class: str, raw: Mapping[str, Any], count: Any) -> Any:
    """``count()`` once per model class and config dict: the 3B and 7B share a vocoder, a thinker saved on its own
    shares the full config's thinker; building on the meta device still costs ~0.5 s (token2wav: ~1 s)."""
    key = (model_class, json.dumps(raw, sort_keys=True, default=str))
    if key not in _COUNTS:
        if len(_COUNTS) > 64:
            _COUNTS.clear()
        _COUNTS[key] = count()
    return _COUNTS[key]


def _counts(cfgs: _Configs) -> tuple[Counted, dict[str, int]]:
    spec = _FAMILIES[cfgs.family]

    def thinker() -> Counted:
        counted = Counted.of(_meta_named(spec.thinker, cfgs.thinker))
        if counted.parts.get("other"):
            raise ValueError(f"{spec.thinker} has parameters of no known part (sizes.classify needs a rule for them)")
        return counted

    counted = _memo(spec.thinker, cfgs.raw["thinker"], thinker)
    untrained = {}
    for role, cls, cfg in (("talker", spec.talker, cfgs.talker), (spec.vocoder, spec.vocoder_class, cfgs.vocoder)):
        if cfg is not None:
            untrained[role] = _memo(cls, cfgs.raw[role], lambda cls=cls, cfg=cfg: sum(n for _, n in _meta_named(cls, cfg)))
    return counted, untrained


def count_thinker(source: str | Path | Mapping[str, Any]) -> tuple[Counted, dict[str, int]]:
    """Exact counts (meta device) of the thinker by part, and of the parts not trained (``talker``, ``token2wav`` or
    ``code2wav``; present only when the config is a full Omni config)."""
    _, config = load_config(source)
    return _counts(_configs(config))


# -- the same counts from the widths -------------------------------------------------------------------------------

def _head_dim(text: Any) -> int:
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def _sparse_layer(text: Any, layer: int) -> bool:
    """transformers' rule (Qwen3-Omni thinker decoder layer): a MoE MLP unless listed dense or off the step."""
    experts = int(getattr(text, "num_experts", 0) or 0)
    step = int(getattr(text, "decoder_sparse_step", 1) or 1)
    return experts > 0 and layer not in (getattr(text, "mlp_only_layers", None) or []) and (layer + 1) % step == 0


def closed_form(source: str | Path | Mapping[str, Any]) -> dict[str, int]:
    """The thinker's parameters per part from the config's widths alone (our formulas, no model built)."""
    _, config = load_config(source)
    return _closed_form(_configs(config))


def _closed_form(cfgs: _Configs) -> dict[str, int]:
    thinker = cfgs.thinker
    qwen3 = cfgs.family == "qwen3_omni_moe"
    t = thinker.text_config
    H, V, L = int(t.hidden_size), int(t.vocab_size), int(t.num_hidden_layers)
    heads, kv, hd = int(t.num_attention_heads), int(t.num_key_value_heads), _head_dim(t)
    q, k = heads * hd, kv * hd
    attention = H * q + 2 * H * k + q * H
    if qwen3:  # Qwen3: q/k/v/o biases iff attention_bias; per-head q/k RMSNorm
        attention += (q + 2 * k + H) if getattr(t, "attention_bias", False) else 0
        layer_norms = 2 * H + 2 * hd
    else:  # Qwen2.5: q/k/v biases always, no o bias
        attention += q + 2 * k
        layer_norms = 2 * H
    parts = dict.fromkeys(TRAINED_PARTS, 0)
    parts["text.embedding"] = V * H
    parts["text.lm_head"] = 0 if getattr(thinker, "tie_word_embeddings", False) else V * H
    parts["text.attention"] = L * attention
    parts["text.norms"] = L * layer_norms + H
    for layer in range(L):
        if _sparse_layer(t, layer):
            experts = int(t.num_experts)
            parts["text.experts"] += experts * 3 * H * int(t.moe_intermediate_size)
            parts["text.router"] += experts * H
        else:
            parts["text.mlp"] += 3 * H * int(t.intermediate_size)
    parts["vision"] = _vision_closed_form(thinker.vision_config, qwen3)
    parts["audio"] = _audio_closed_form(thinker.audio_config, qwen3)
    return parts


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _vision_closed_form(v: Any, qwen3: bool) -> int:
    C, inter, depth, out = int(v.hidden_size), int(v.intermediate_size), int(v.depth), int(v.out_hidden_size)
    merged = C * int(v.spatial_merge_size) ** 2  # patches merged 2 x 2 before the merger MLP
    patch = C * int(v.in_channels) * int(v.temporal_patch_size) * int(v.patch_size) ** 2
    merger_mlp = _linear(merged, merged) + _linear(merged, out)
    if qwen3:  # LayerNorms (weight + bias), fused qkv, GELU MLP; learned position table; deepstack mergers
        block = 4 * C + _linear(C, 3 * C) + _linear(C, C) + _linear(C, inter) + _linear(inter, C)
        deepstack = len(getattr(v, "deepstack_visual_indexes", None) or [])
        return (patch + C + int(v.num_position_embeddings) * C + depth * block + 2 * C + merger_mlp
                + deepstack * (2 * merged + merger_mlp))
    # Qwen2.5: RMSNorms (weight only), separate q/k/v/proj with biases, SwiGLU MLP with biases; no patch bias
    block = 2 * C + 4 * _linear(C, C) + 2 * _linear(C, inter) + _linear(inter, C)
    return patch + depth * block + C + merger_mlp


def _audio_closed_form(a: Any, qwen3: bool) -> int:
    d, ffn, layers, mels, out = (int(a.d_model), int(a.encoder_ffn_dim), int(a.encoder_layers),
                                 int(a.num_mel_bins), int(a.output_dim))
    attention = 4 * _linear(d, d) - (0 if qwen3 else d)  # Qwen2.5's k_proj has no bias
    layer = attention + 4 * d + _linear(d, ffn) + _linear(ffn, d)  # two LayerNorms, GELU MLP
    if qwen3:  # three stride-2 3x3 convolutions over (time, mel), then a linear to d_model; proj1 -> proj2
        ds = int(a.downsample_hidden_size)
        freq = (((mels + 1) // 2 + 1) // 2 + 1) // 2
        front = (ds * 9 + ds) + 2 * (ds * ds * 9 + ds) + ds * freq * d
        return front + layers * layer + 2 * d + _linear(d, d) + _linear(d, out)
    # Qwen2.5: two 1-D convolutions (kernel 3), audio bos/eos embeddings (2 x output width), ln_post, proj
    front = (d * mels * 3 + d) + (d * d * 3 + d) + 2 * out
    return front + layers * layer + 2 * d + _linear(d, out)


# -- a layout's ranks -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    def __str__(self) -> str:
        return f"TP{self.tp} PP{self.pp} EP{self.ep} DP{self.dp}"


@dataclass(frozen=True)
class RankBytes:
    """One rank of a pipeline stage (every tensor / expert / data rank of a stage holds the same)."""

    stage: int
    layers: tuple[int, int]  # decoder layers first .. stop - 1
    params: dict[str, int]  # part -> params this rank holds (after the tensor / expert split)
    expert_params: int  # of those, experts (their optimizer state divides over dp / ep, not dp)
    weights: int  # bytes
    grads: int
    master: int
    moments: int

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.moments


def _check_layout(text: Any, layout: Layout) -> None:
    """Megatron's rules for a layout (what megatron-core or ``ParallelSection`` would refuse), with the field."""
    for name, value in (("tp", layout.tp), ("pp", layout.pp), ("ep", layout.ep), ("dp", layout.dp)):
        if value < 1:
            raise ValueError(f"{name}={value}: must be >= 1")
    checks = [("text_config.num_attention_heads", int(text.num_attention_heads), layout.tp, "tp"),
              ("text_config.num_key_value_heads", int(text.num_key_value_heads), layout.tp,
               "tp (Megatron splits whole key/value groups)"),
              ("text_config.num_hidden_layers", int(text.num_hidden_layers), layout.pp,
               "pp (megatron-core splits the decoder layers evenly)")]
    experts = int(getattr(text, "num_experts", 0) or 0)
    if any(not _sparse_layer(text, i) for i in range(int(text.num_hidden_layers))):
        checks.append(("text_config.intermediate_size", int(text.intermediate_size), layout.tp, "tp"))
    if experts:
        checks += [("text_config.num_experts", experts, layout.ep, "ep"),
                   ("text_config.moe_intermediate_size", int(text.moe_intermediate_size), layout.tp,
                    "tp (the expert tensor parallel size is tp)")]
    elif layout.ep != 1:
        raise ValueError(f"ep={layout.ep}: this decoder has no experts (text_config.num_experts is 0)")
    if layout.dp % layout.ep:
        raise ValueError(f"ep={layout.ep} must divide dp={layout.dp}: experts are split over the data-parallel ranks "
                         "(actor.parallel, Megatron's layout)")
    for field_name, value, size, what in checks:
        if value % size:
            raise ValueError(f"{field_name}={value} is not a multiple of {what}={size}")


def _rank_params(counted: Counted, text: Any, tied: bool, layout: Layout, stage: int) -> tuple[dict[str, int], int]:
    L = int(text.num_hidden_layers)
    per_stage = L // layout.pp
    first, stop = stage * per_stage, (stage + 1) * per_stage
    tp = layout.tp
    H = int(text.hidden_size)
    table = padded_vocab(int(text.vocab_size), tp) * H // tp  # one tensor rank's rows of the embedding / output layer
    params = dict.fromkeys(TRAINED_PARTS, 0)
    for part in _TP_SPLIT:
        params[part] = counted.layer_sum(part, first, stop) // tp
    for part in _REPLICATED:
        params[part] = counted.layer_sum(part, first, stop)
    params["text.experts"] = counted.layer_sum("text.experts", first, stop) // (layout.ep * tp)
    if stage == 0:
        params["text.embedding"] = table
        params["vision"], params["audio"] = counted.parts["vision"], counted.parts["audio"]
    if stage == layout.pp - 1:
        params["text.norms"] += counted.fixed["text.norms"]  # the final norm
        if not tied or layout.pp > 1:  # untied head, or the last stage's copy of a tied table
            params["text.lm_head"] = table
    return params, params["text.experts"]


def _rank_bytes(params: dict[str, int], experts: int, stage: int, layers: tuple[int, int], layout: Layout,
                dtype: str, optimizer: str, distributed: bool) -> RankBytes:
    n = sum(params.values())
    width = DTYPE_BYTES[dtype]
    if distributed:  # ZeRO-1: master weights and moments of dense params over dp, of experts over dp / ep
        owned = -(-(n - experts) // layout.dp) + -(-experts // (layout.dp // layout.ep))
    else:
        owned = n
    if optimizer == "mixed":
        master = owned * 4 if dtype != "float32" else 0
        moments = owned * 8
    else:
        master, moments = 0, owned * 2 * width
    return RankBytes(stage=stage, layers=layers, params=params, expert_params=experts, weights=n * width,
                     grads=n * width, master=master, moments=moments)


def kv_cache_bytes_per_token(text: Any, dtype: str = "bfloat16", tp: int = 1) -> tuple[int, int]:
    """``(bytes per token, kv heads per tensor rank)`` of the decoder's KV cache on one of ``tp`` inference ranks:
    kv heads split over ``tp``, one (replicated) per rank when ``tp`` exceeds them."""
    kv = int(text.num_key_value_heads)
    per_rank = max(1, -(-kv // tp))
    return 2 * int(text.num_hidden_layers) * per_rank * _head_dim(text) * DTYPE_BYTES[dtype], per_rank


# -- the report -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SizeReport:
    """What :func:`format_report` prints (bytes are bytes; GiB = 2**30 bytes in the text)."""

    source: str
    family: str
    dtype: str
    layout: Layout
    optimizer: str  # "mixed" | "plain"
    distributed_optimizer: bool
    parts: dict[str, int]  # thinker parts (exact, meta device)
    closed_form: dict[str, int]  # the same from the widths
    untrained: dict[str, int]  # talker, token2wav / code2wav
    depths: dict[str, int]  # text layers, vision blocks, audio layers
    widths: dict[str, Any]  # hidden, vocab, heads, kv heads, head dim, experts ...
    stages: tuple[RankBytes, ...]
    kv_bytes_per_token: int  # whole model (tp 1)
    kv_bytes_per_token_per_rank: int  # one of the layout's tp ranks
    kv_heads_per_rank: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def trained(self) -> int:
        return sum(self.parts.values())

    @property
    def largest(self) -> RankBytes:
        return max(self.stages, key=lambda s: (s.total, -s.stage))


def size_report(source: str | Path | Mapping[str, Any], *, tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1,
                dtype: str = "bfloat16", distributed_optimizer: bool = False,
                optimizer: Literal["mixed", "plain"] = "mixed") -> SizeReport:
    """The size report of ``source`` (config dict, checkpoint directory, config.json path or published name) at its
    config's depth, for the layout of ``tp`` x ``pp`` x ``dp`` ranks (``ep`` of the data ranks share the experts)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    if optimizer not in ("mixed", "plain"):
        raise ValueError(f"optimizer={optimizer!r}: 'mixed' (Megatron's fp32 master + fp32 Adam) or 'plain' "
                         "(torch AdamW in the weight dtype, as the actor runs today)")
    label, config = load_config(source)
    cfgs = _configs(config)
    thinker, text = cfgs.thinker, cfgs.thinker.text_config
    layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp)
    _check_layout(text, layout)
    counted, untrained = _counts(cfgs)
    tied = counted.parts["text.lm_head"] == 0  # transformers tied the head to the table (named_parameters drops it)
    per_stage = int(text.num_hidden_layers) // pp
    stages = []
    for s in range(pp):
        params, experts = _rank_params(counted, text, tied, layout, s)
        stages.append(_rank_bytes(params, experts, s, (s * per_stage, (s + 1) * per_stage), layout, dtype,
                                  optimizer, distributed_optimizer))
    kv_total, _ = kv_cache_bytes_per_token(text, dtype, 1)
    kv_rank, kv_heads = kv_cache_bytes_per_token(text, dtype, tp)
    vision, audio = thinker.vision_config, thinker.audio_config
    widths = {"hidden": int(text.hidden_size), "vocab": int(text.vocab_size), "heads": int(text.num_attention_heads),
              "kv_heads": int(text.num_key_value_heads), "head_dim": _head_dim(text), "tied": tied,
              "experts": int(getattr(text, "num_experts", 0) or 0),
              "experts_per_token": int(getattr(text, "num_experts_per_tok", 0) or 0),
              "vision_width": int(vision.hidden_size), "audio_width": int(audio.d_model)}
    depths = {"text": int(text.num_hidden_layers), "vision": int(vision.depth), "audio": int(audio.encoder_layers)}
    notes = []
    text_tied = bool(getattr(text, "tie_word_embeddings", False))
    if text_tied != tied:
        notes.append(f"text_config.tie_word_embeddings={text_tied} but the thinker's is {tied}: transformers "
                     "follows the thinker's; the megatron backend reads text_config's")
    return SizeReport(source=label, family=cfgs.family, dtype=dtype, layout=layout, optimizer=optimizer,
                      distributed_optimizer=distributed_optimizer, parts=dict(counted.parts),
                      closed_form=_closed_form(cfgs), untrained=untrained, depths=depths, widths=widths,
                      stages=tuple(stages), kv_bytes_per_token=kv_total, kv_bytes_per_token_per_rank=kv_rank,
                      kv_heads_per_rank=kv_heads, notes=tuple(notes))


def _gib(n: int) -> str:
    return f"{n / 2**30:9.2f} GiB"


def _count(n: int) -> str:
    return f"{n:>15,}"


_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _parameter_lines(r: SizeReport) -> list[str]:
    w = r.widths
    total = r.trained + sum(r.untrained.values())
    experts = f"text routed experts ({w['experts']}, top {w['experts_per_token']})"
    rows = [("text.embedding", f"text embedding ({w['vocab']} x {w['hidden']})"),
            ("text.lm_head", "text lm_head" + (" (tied: 0)" if w["tied"] else "")),
            ("text.attention", f"text attention ({r.depths['text']} layers, {w['heads']}/{w['kv_heads']} heads)"),
            ("text.mlp", "text dense MLP"), ("text.experts", experts), ("text.shared_experts", "text shared experts"),
            ("text.router", "text router"), ("text.norms", "text norms"),
            ("vision", f"vision tower ({r.depths['vision']} blocks, {w['vision_width']} wide)"),
            ("audio", f"audio tower ({r.depths['audio']} layers, {w['audio_width']} wide)")]
    lines = [f"{'parameters':<46}{'count':>15}  {'share':>6}"]
    for part, label in rows:
        n = r.parts.get(part, 0)
        if n or part in ("text.embedding", "text.lm_head", "text.attention"):
            lines.append(f"  {label:<44}{_count(n)}  {n / total:6.1%}")
    lines.append(f"  {'thinker (trained)':<44}{_count(r.trained)}  {r.trained / total:6.1%}")
    for part, n in r.untrained.items():
        lines.append(f"  {part + ' (not trained)':<44}{_count(n)}  {n / total:6.1%}")
    if r.untrained:
        lines.append(f"  {'whole checkpoint':<44}{_count(total)}")
    agree = "agrees" if r.closed_form == r.parts else "DIFFERS"
    lines.append(f"  (the closed form from the widths {agree} with this meta-device count)")
    return lines


def _rank_lines(r: SizeReport) -> list[str]:
    big, layout = r.largest, r.layout
    holds = ", embedding, towers" if big.stage == 0 else ""
    holds += ", final norm, output layer" if big.stage == layout.pp - 1 else ""
    lines = [f"bytes per rank, the largest: stage {big.stage} of {layout.pp} (decoder layers "
             f"{big.layers[0]}-{big.layers[1] - 1}{holds})"]
    if layout.pp > 1:
        lines.append("  every stage: " + ", ".join(f"{s.stage}: {s.total / 2**30:.2f} GiB" for s in r.stages))
    text = sum(n for p, n in big.params.items() if p.startswith("text.")) - big.expert_params
    towers = big.params["vision"] + big.params["audio"]
    lines.append(f"  {'parameters on the rank':<44}{_count(big.total_params)}")
    split = f" (matrices and padded vocabulary / TP{layout.tp}, norms whole)" if layout.tp > 1 else ""
    held = [f"decoder {text:,}{split}"]
    if big.expert_params:
        held.append(f"experts {big.expert_params:,} (/ EP{layout.ep} x TP{layout.tp})")
    if towers:
        held.append(f"towers {towers:,} (whole)")
    lines.extend("    " + h for h in held)
    width = DTYPE_BYTES[r.dtype]
    short = _SHORT[r.dtype]
    zero = " / DP" if r.distributed_optimizer else ""

    def row(label: str, kind: str, per: str, n: int, note: str = "") -> str:
        return f"  {label:<16}{kind:<10}{per:<16}{_gib(n)}  {note}".rstrip()

    lines.append(row("weights", short, f"{width} B/param", big.weights))
    lines.append(row("gradients", short, f"{width} B/param", big.grads, "the actor's p.grad: weight dtype"))
    if r.optimizer == "mixed":
        if big.master:
            lines.append(row("master weights", "fp32", f"4 B/param{zero}", big.master, "Megatron mixed precision"))
        lines.append(row("Adam moments", "2 x fp32", f"8 B/param{zero}", big.moments,
                         "experts / (DP/EP)" if r.distributed_optimizer and big.expert_params else ""))
    else:
        lines.append(row("Adam moments", f"2 x {short}", f"{2 * width} B/param{zero}", big.moments,
                         "plain torch AdamW, as the actor runs today"))
    lines.append(row("total", "", "", big.total, "+ activations and buffers"))
    return lines


def format_report(report: SizeReport) -> str:
    """The report as plain aligned text, one screen (about 30 lines)."""
    r, w = report, report.widths
    short = _SHORT[r.dtype]
    zero = ", distributed optimizer" if r.distributed_optimizer else ""
    lines = [f"{r.source} ({r.family}): {r.dtype}, {r.layout}{zero}", ""]
    lines += _parameter_lines(r) + [""] + _rank_lines(r) + [""]
    per_rank = (f"; per TP{r.layout.tp} rank {r.kv_bytes_per_token_per_rank / 1024:.1f} KiB "
                f"({r.kv_heads_per_rank} kv head{'s' if r.kv_heads_per_rank > 1 else ''})" if r.layout.tp > 1 else "")
    lines.append(f"KV cache per token ({short}): 2 x {r.depths['text']} layers x {w['kv_heads']} kv heads x "
                 f"{w['head_dim']} x {DTYPE_BYTES[r.dtype]} B = {r.kv_bytes_per_token / 1024:.1f} KiB{per_rank}")
    lines.extend(f"note: {n}" for n in r.notes)
    return "\n".join(lines)


# -- the check: a stand-in's measured sizes scaled by depth -------------------------------------------------------

def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header (8-byte length, then JSON); no tensor data read."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def measure_checkpoint(directory: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint directory with its shape, from ``model.safetensors.index.json``'s weight names
    and the shards' headers (or a single ``model.safetensors``)."""
    root = Path(directory)
    index = root / INDEX_FILE
    if not index.is_file():
        single = root / "model.safetensors"
        if single.is_file():
            return _safetensors_shapes(single)
        raise FileNotFoundError(f"{index}: missing (and no model.safetensors)")
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: no weight_map")
    shapes: dict[str, tuple[int, ...]] = {}
    headers: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, file in weight_map.items():
        if file not in headers:
            shard = root / file
            if not shard.is_file():
                raise FileNotFoundError(f"{shard}: missing (named by {INDEX_FILE} for {name})")
            headers[file] = _safetensors_shapes(shard)
        if name not in headers[file]:
            raise ValueError(f"{root / file}: has no tensor {name} ({INDEX_FILE} says it does)")
        shapes[name] = headers[file][name]
    return shapes


def _depths(thinker: Any) -> dict[str, int]:
    vision = thinker.vision_config
    return {"text": int(thinker.text_config.num_hidden_layers), "vision": int(vision.depth),
            "deepstack": len(getattr(vision, "deepstack_visual_indexes", None) or []),
            "audio": int(thinker.audio_config.encoder_layers)}


def predict_from_standin(directory: str | Path, full: str | Path | Mapping[str, Any]) -> dict[str, int]:
    """The thinker's parameters per part at ``full``'s depth, predicted from a stand-in directory: each part's
    tensors outside the repeated stacks as measured, plus one measured stack item (decoder layer, vision block,
    deepstack merger, audio layer) times the full config's number of items. Raises when the stand-in's items of a
    stack differ in size (no single per-layer figure) or its files and its config.json disagree on a depth."""
    root = Path(directory)
    _, standin_config = load_config(root)
    shapes = measure_checkpoint(root)
    family, is_full = _family(standin_config)
    names = ((n, math.prod(s)) for n, s in shapes.items() if not is_full or n.startswith("thinker."))
    counted = Counted.of(names)
    if counted.parts.get("other"):
        others = [n for n in shapes if classify(n).part == "other" and (not is_full or n.startswith("thinker."))]
        raise ValueError(f"{root}: thinker tensors of no known part: {others[:4]}")
    have = _depths(_configs(standin_config).thinker)
    for stack, depth in have.items():
        found = counted.stack_items(stack)
        if found and found != depth:
            raise ValueError(f"{root / 'config.json'}: says {depth} {stack} items, the safetensors hold {found}")
    _, full_config = load_config(full)
    want = _depths(_configs(full_config).thinker)
    out = {p: counted.fixed.get(p, 0) for p in TRAINED_PARTS}
    for (part, stack), items in counted.items.items():
        if len(set(items)) != 1:
            raise ValueError(f"{root}: the {stack} items of {part} differ in size {items}: no per-layer figure")
        out[part] += items[0] * want[stack]
    return out
