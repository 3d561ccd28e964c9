"""What a checkpoint directory must hold, checked before anything loads it: one clear error naming the file and field.

A directory ``model.path`` loads holds (the published Qwen-Omni layout, or a thinker saved on its own):

- ``config.json``: a full Omni config (``model_type`` ``qwen2_5_omni`` / ``qwen3_omni_moe`` with ``thinker_config``;
  the talker and the vocoder are not loaded) or a thinker config (``qwen2_5_omni_thinker`` /
  ``qwen3_omni_moe_thinker``);
- the weights as safetensors: ``model.safetensors``, or shards named by ``model.safetensors.index.json``
  (``weight_map``); a full checkpoint's thinker tensors carry the ``thinker.`` prefix;
- the tokenizer: ``tokenizer_config.json`` and ``tokenizer.json`` (or ``vocab.json`` + ``merges.txt``), with the
  media tokens (``<|IMAGE|>`` ... or Qwen3-Omni's ``<|image_pad|>`` ...) as single tokens;
- ``preprocessor_config.json`` (image and audio settings); optional: ``video_preprocessor_config.json``,
  ``chat_template.jinja`` / ``chat_template.json``, ``generation_config.json``.

Why check first: transformers meets a missing shard with a long traceback, and a tensor the config describes but the
weights lack with a warning and a *random* initialisation — a run would train noise. So every check here reads
headers only (``safetensors.safe_open``: names, dtypes, shapes; no weights), builds the thinker on the meta device
from the config, and maps the checkpoint's tensor names to the model's with transformers' own load-time renames
(``conversion_mapping`` / ``core_model_loading``: the ``thinker.`` prefix, ``model.`` → ``model.language_model.``,
Qwen3-Omni's per-expert tensors fused), so "what loads" is decided by the same rules ``from_pretrained`` applies.

Every failure raises :class:`CheckpointDirError` (a ``ValueError``; :class:`MissingCheckpointFile` is also a
``FileNotFoundError``) whose message is one line: ``<file>: <field>: <what is wrong>; <what to do>``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Qwen2_5OmniThinkerConfig,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from relax_gym.trainer.policy.tokenizer import MEDIA_TOKENS

__all__ = [
    "CONFIG_FILE", "FAMILIES", "INDEX_FILE", "PREPROCESSOR_FILE", "SINGLE_FILE", "CheckpointDir", "CheckpointDirError",
    "Family", "MissingCheckpointFile", "TensorInfo", "WeightCheck", "check_processor", "check_tokenizer",
    "media_token_ids", "meta_thinker", "read_json", "read_weights",
    "check_tokenizer_files", "check_weights", "checkpoint_dtype", "read_checkpoint_dir", "thinker_config",
]

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PREPROCESSOR_FILE = "preprocessor_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

#: safetensors' dtype names -> torch's
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")


class CheckpointDirError(ValueError):
    """A checkpoint directory that cannot be loaded as it is; the message names the file and the field."""


class MissingCheckpointFile(CheckpointDirError, FileNotFoundError):
    """A file the directory must hold is not there."""


@dataclass(frozen=True)
class Family:
    """One model family (``PolicyConfig.family``): its ``model_type`` spellings, classes and the parts of the full
    model that are not the thinker."""

    name: str
    full_type: str
    thinker_type: str
    config_class: type[PretrainedConfig]
    model_class: type
    other_parts: tuple[str, ...]  # the full model's other top-level modules (not loaded)
    processor_class: str  # transformers' processor of the family (preprocessor_config.json's processor_class)


FAMILIES: dict[str, Family] = {
    "qwen2_5_omni": Family("qwen2_5_omni", "qwen2_5_omni", "qwen2_5_omni_thinker", Qwen2_5OmniThinkerConfig,
                           Qwen2_5OmniThinkerForConditionalGeneration, ("talker", "token2wav"), "Qwen2_5OmniProcessor"),
    "qwen3_omni_moe": Family("qwen3_omni_moe", "qwen3_omni_moe", "qwen3_omni_moe_thinker", Qwen3OmniMoeThinkerConfig,
                             Qwen3OmniMoeThinkerForConditionalGeneration, ("talker", "code2wav"), "Qwen3OmniMoeProcessor"),
}
_BY_TYPE = {t: f for f in FAMILIES.values() for t in (f.full_type, f.thinker_type)}


@dataclass(frozen=True)
class TensorInfo:
    shard: str  # file name inside the directory
    dtype: str  # torch's name (bfloat16, float32, ...)
    shape: tuple[int, ...]


@dataclass
class CheckpointDir:
    """What a directory holds, read from ``config.json`` and the safetensors headers (no weights loaded)."""

    path: Path
    config: dict[str, Any]  # config.json as written
    family: Family
    full: bool  # a full Omni config (thinker_config + talker ...) rather than a thinker's own
    thinker: dict[str, TensorInfo] = field(default_factory=dict)  # thinker tensors as the files name them
    skipped: dict[str, int] = field(default_factory=dict)  # part of the full model -> tensors not loaded
    shards: list[str] = field(default_factory=list)
    total_bytes: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)  # thinker tensors per dtype
    all_dtypes: dict[str, int] = field(default_factory=dict)  # every tensor per dtype

    @property
    def prefix(self) -> str:
        """The thinker's key prefix in the weight files (``thinker.`` in a full checkpoint)."""
        return "thinker." if self.full else ""

    @property
    def field_prefix(self) -> str:
        """How config.json spells the thinker's fields (``thinker_config.`` in a full config)."""
        return "thinker_config." if self.full else ""

    @property
    def thinker_dict(self) -> dict[str, Any]:
        return self.config["thinker_config"] if self.full else self.config

    @property
    def config_dtype(self) -> str | None:
        """``torch_dtype`` / ``dtype`` as config.json states it (the thinker's, else the top level's)."""
        return _stated_dtype(self.config)

    @property
    def weights_dtype(self) -> str | None:
        """The dtype most of the thinker's floating tensors are stored in."""
        floats = {k: v for k, v in self.dtypes.items() if k in FLOAT_DTYPES}
        return max(floats, key=floats.__getitem__) if floats else None

    def file(self, name: str) -> Path:
        return self.path / name

    def where(self, key: str) -> str:
        """``<dir>/<shard>: <tensor>`` of a thinker tensor (its name as the checkpoint spells it)."""
        info = self.thinker.get(key)
        return f"{self.path / info.shard}: {key}" if info else f"{self.path}: {key}"


def _fail(file: Path | str, what: str, *, missing: bool = False) -> CheckpointDirError:
    """The one-line error: ``file: what`` (newlines folded, so a log shows one line)."""
    message = f"{file}: {what}".replace("\n", " ")
    return MissingCheckpointFile(message) if missing else CheckpointDirError(message)


def read_json(file: Path) -> dict[str, Any]:
    """A JSON object file, or a one-line error naming it (and the line and column of a syntax error)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(file, f"cannot be read ({type(exc).__name__}: {exc})") from exc
    except json.JSONDecodeError as exc:
        raise _fail(file, f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise _fail(file, f"must hold a JSON object, found a {type(data).__name__}")
    return data


# -- config.json and the weight files ---------------------------------------------------------------------------

def read_checkpoint_dir(path: str | Path, family: str | None = None, *, weights: bool = True) -> CheckpointDir:
    """Read ``config.json`` and every safetensors header of ``path``; check that the config is a Qwen-Omni one of
    ``family`` (None: whichever ``model_type`` says), that every shard the index names exists and holds the tensors
    the index puts there, and that the full model's thinker tensors are present. ``weights=False`` reads the config
    only (:func:`read_weights` reads the headers later)."""
    path = Path(path)
    if not path.is_dir():
        raise _fail(path, "no such directory (model.path must be a checkpoint directory)", missing=True)
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise _fail(config_file, "missing: not a model checkpoint directory (it needs config.json, the safetensors "
                                 "weights, the tokenizer files and preprocessor_config.json; see docs/models.md)",
                    missing=True)
    config = read_json(config_file)
    fam = _family_of(config, config_file, family)
    full = config.get("model_type") == fam.full_type
    if full and not isinstance(config.get("thinker_config"), dict):
        raise _fail(config_file, f"thinker_config: missing; a {fam.full_type!r} config holds the thinker's config "
                                 "under thinker_config")
    d = CheckpointDir(path=path, config=config, family=fam, full=full)
    if weights:
        read_weights(d)
    return d


def _family_of(config: dict[str, Any], config_file: Path, family: str | None) -> Family:
    model_type = config.get("model_type")
    known = sorted(_BY_TYPE)
    if model_type is None:
        raise _fail(config_file, f"model_type: missing (relax-gym loads {', '.join(known)})")
    fam = _BY_TYPE.get(model_type)
    if fam is None:
        raise _fail(config_file, f"model_type: {model_type!r} is not a Qwen-Omni model (relax-gym loads "
                                 f"{', '.join(known)})")
    if family is not None and fam.name != family:
        raise _fail(config_file, f"model_type: {model_type!r} is a {fam.name} checkpoint but model.family is "
                                 f"{family!r}; set model.family={fam.name}")
    return fam


def _weight_map(path: Path) -> dict[str, str]:
    """tensor name -> shard file, from the index (or the single file's header)."""
    index = path / INDEX_FILE
    if index.is_file():
        data = read_json(index)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise _fail(index, "weight_map: missing or empty (it maps every tensor name to its shard file)")
        bad = [k for k, v in weight_map.items() if not isinstance(v, str)]
        if bad:
            raise _fail(index, f"weight_map: {bad[0]!r} maps to {weight_map[bad[0]]!r}, not a file name")
        return dict(weight_map)
    single = path / SINGLE_FILE
    if single.is_file():
        return {k: SINGLE_FILE for k in _header(path, SINGLE_FILE)}
    other = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf") and p.name != "spk_dict.pt")
    if other:
        raise _fail(path / other[0], "relax-gym reads safetensors weights only; convert the checkpoint "
                                     "(transformers: from_pretrained then save_pretrained writes safetensors)")
    raise _fail(path / SINGLE_FILE, f"missing: the directory holds no weights ({SINGLE_FILE}, or shards named by "
                                    f"{INDEX_FILE})", missing=True)


def _header(path: Path, shard: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor: (dtype, shape)}`` of one safetensors file, from its header only."""
    from safetensors import safe_open

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    try:
        with safe_open(str(path / shard), framework="pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                out[key] = (SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype().lower()), tuple(sl.get_shape()))
    except Exception as exc:  # safetensors raises its own SafetensorError on a cut or foreign file
        raise _fail(path / shard, f"not a readable safetensors file ({type(exc).__name__}: {str(exc)[:200]})") from exc
    return out


def read_weights(d: CheckpointDir) -> None:
    """Fill ``d`` from the weight files' headers (see :func:`read_checkpoint_dir`)."""
    weight_map = _weight_map(d.path)
    by_shard: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(key)
    index = d.path / INDEX_FILE
    for shard in sorted(by_shard):
        if not (d.path / shard).is_file():
            raise _fail(index, f"weight_map: shard {shard} ({len(by_shard[shard])} tensors, e.g. "
                               f"{sorted(by_shard[shard])[0]}) is not in the directory", missing=True)
    all_dtypes: Counter[str] = Counter()
    thinker_dtypes: Counter[str] = Counter()
    for shard in sorted(by_shard):
        header = _header(d.path, shard)
        absent = [k for k in by_shard[shard] if k not in header]
        if absent:
            raise _fail(index, f"weight_map: {absent[0]} is placed in {shard}, which holds no such tensor"
                               f"{f' ({len(absent)} such tensors)' if len(absent) > 1 else ''}")
        d.shards.append(shard)
        d.total_bytes += (d.path / shard).stat().st_size
        for key in by_shard[shard]:
            dtype, shape = header[key]
            all_dtypes[dtype] += 1
            if d.full and not key.startswith("thinker."):
                part = key.split(".", 1)[0]
                d.skipped[part] = d.skipped.get(part, 0) + 1
                continue
            d.thinker[key] = TensorInfo(shard, dtype, shape)
            thinker_dtypes[dtype] += 1
    d.dtypes, d.all_dtypes = dict(thinker_dtypes), dict(all_dtypes)
    if not d.thinker:
        where = index if index.is_file() else d.path / SINGLE_FILE
        raise _fail(where, f"holds no thinker tensor (expected names like {d.prefix}model.embed_tokens.weight; "
                           f"found {', '.join(sorted(d.skipped)) or 'nothing'})")


def _stated_dtype(config: dict[str, Any]) -> str | None:
    thinker = config.get("thinker_config") if isinstance(config.get("thinker_config"), dict) else {}
    for source in (thinker, config):
        for key in ("torch_dtype", "dtype"):
            if isinstance(source.get(key), str) and source[key] in FLOAT_DTYPES:
                return source[key]
    return None


def checkpoint_dtype(path: str | Path) -> str:
    """The dtype a checkpoint is stored in: ``torch_dtype`` / ``dtype`` of its config.json (the thinker's first),
    else the dtype most of its thinker tensors have, else float32. What ``model.dtype: auto`` loads."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise _fail(file, "missing: not a model checkpoint directory", missing=True)
    stated = _stated_dtype(read_json(file))
    return stated or read_checkpoint_dir(path).weights_dtype or "float32"


def thinker_config(d: CheckpointDir) -> PretrainedConfig:
    """The thinker's config object, built from config.json's (``thinker_config`` of a full config) as the full
    config class builds its sub-config (``Qwen2_5OmniConfig`` / ``Qwen3OmniMoeConfig`` -> ``thinker_config``), but
    without building the talker's (whose defaults make transformers warn about token ids)."""
    raw = dict(d.thinker_dict)
    if "dtype" not in raw and "torch_dtype" not in raw and d.config_dtype is not None:
        raw["torch_dtype"] = d.config_dtype  # a full config may state it at the top level only
    try:
        return d.family.config_class.from_dict(raw)
    except Exception as exc:
        raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix or 'the config'}: transformers' "
                                         f"{d.family.config_class.__name__} refuses it ({type(exc).__name__}: "
                                         f"{str(exc)[:300]})") from exc


# -- config against weights ---------------------------------------------------------------------------------------

#: in-memory name patterns of the stacks whose depth the config sets: (regex, sub-config, depth field, name)
_STACKS = (
    (re.compile(r"^model\.language_model\.layers\.(\d+)\."), "text_config", "num_hidden_layers", "decoder layer(s)"),
    (re.compile(r"^model\.visual\.blocks\.(\d+)\."), "vision_config", "depth", "vision block(s)"),
    (re.compile(r"^model\.audio_tower\.layers\.(\d+)\."), "audio_config", "encoder_layers", "audio layer(s)"),
)
_SUBCONFIG_OF = (("model.language_model.", "text_config"), ("lm_head.", "text_config"),
                 ("model.visual.", "vision_config"), ("model.audio_tower.", "audio_config"))
EMBED = "model.language_model.embed_tokens.weight"


@dataclass
class WeightCheck:
    """The checkpoint's tensors against the model the config describes (meta device)."""

    loaded: dict[str, list[str]]  # model parameter / buffer -> checkpoint tensors that fill it
    unexpected: list[str]  # thinker tensors the model has no place for (transformers skips them)
    tied: list[str]  # parameters tied to another (no tensor needed)
    parameters: int  # parameters of the thinker the config describes


def _conversions(model: torch.nn.Module, full: bool) -> tuple[list[Any], list[Any]]:
    """transformers' load-time renames and converters for ``model`` (as ``from_pretrained`` builds them)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    maps = get_model_conversion_mapping(model, {r"^thinker\.": ""} if full else None)
    return ([m for m in maps if isinstance(m, WeightRenaming)], [m for m in maps if isinstance(m, WeightConverter)])


def meta_thinker(d: CheckpointDir, config: PretrainedConfig) -> torch.nn.Module:
    """The thinker ``config`` describes, on the meta device (nothing allocated)."""
    try:
        with torch.device("meta"):
            return d.family.model_class(config)
    except Exception as exc:
        raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix or 'the config'}: the thinker cannot be built from it "
                                         f"({type(exc).__name__}: {str(exc)[:300]})") from exc


def check_weights(d: CheckpointDir, config: PretrainedConfig) -> WeightCheck:
    """Check the thinker's tensors against ``config``: vocabulary and hidden size on the embedding, the depth of
    each stack, every shape, and that every parameter the config describes has a tensor (transformers would
    initialise a missing one at random)."""
    from transformers.core_model_loading import rename_source_key

    model = meta_thinker(d, config)
    meta = model.state_dict()
    renamings, converters = _conversions(model, d.full)
    prefix = model.base_model_prefix
    loaded: dict[str, list[str]] = {}
    patterns: dict[str, str | None] = {}
    unexpected: list[str] = []
    targets: list[str] = []
    for key in sorted(d.thinker, key=_natural):
        target, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        if target not in meta and key in meta:
            target, pattern = key, None
        targets.append(target)
        if target not in meta:
            unexpected.append(key)
            continue
        loaded.setdefault(target, []).append(key)
        patterns[target] = pattern
    text = config.get_text_config()
    _check_embedding(d, config, loaded)
    _check_depths(d, config, targets)
    _check_shapes(d, meta, loaded, patterns, text)
    tied = sorted(getattr(model, "all_tied_weights_keys", {}) or {})
    ignored = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    params = dict(model.named_parameters())
    missing = [k for k in params if k not in loaded and k not in tied and not any(p.search(k) for p in ignored)]
    if missing:
        where = d.path / INDEX_FILE if (d.path / INDEX_FILE).is_file() else d.path / SINGLE_FILE
        sub = _subconfig(missing[0])
        raise _fail(where, f"no tensor for {len(missing)} parameter(s) {d.field_prefix}{sub} describes, e.g. "
                           f"{_published_name(d, missing[0])} (model: {missing[0]}); transformers would initialise "
                           "them at random. The config does not match the weights, or a shard is incomplete")
    return WeightCheck(loaded=loaded, unexpected=unexpected, tied=tied,
                       parameters=sum(p.numel() for p in params.values()))


def _natural(key: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("."))


def _subconfig(target: str) -> str:
    for stem, sub in _SUBCONFIG_OF:
        if target.startswith(stem):
            return sub
    return "the thinker config"


def _published_name(d: CheckpointDir, target: str) -> str:
    """A model parameter's name as the checkpoint would spell it (best effort, for messages)."""
    name = target
    for stem, repl in (("model.language_model.", "model."), ("model.visual.", "visual."),
                       ("model.audio_tower.", "audio_tower.")):
        if name.startswith(stem):
            name = repl + name[len(stem):]
            break
    return d.prefix + name


def _check_embedding(d: CheckpointDir, config: PretrainedConfig, loaded: dict[str, list[str]]) -> None:
    text = config.get_text_config()
    field = f"{d.field_prefix}text_config"
    for target in (EMBED, "lm_head.weight"):
        for key in loaded.get(target, []):
            rows, cols = (d.thinker[key].shape + (0, 0))[:2]
            if rows != text.vocab_size:
                raise _fail(d.file(CONFIG_FILE), f"{field}.vocab_size is {text.vocab_size} but {d.where(key)} has "
                                                 f"{rows} rows (shape {list(d.thinker[key].shape)}): the config's "
                                                 "vocabulary size does not match the weights")
            if cols != text.hidden_size:
                raise _fail(d.file(CONFIG_FILE), f"{field}.hidden_size is {text.hidden_size} but {d.where(key)} is "
                                                 f"{cols} wide (shape {list(d.thinker[key].shape)}): the config's "
                                                 "hidden size does not match the weights")


def _check_depths(d: CheckpointDir, config: PretrainedConfig, targets: list[str]) -> None:
    """Each stack holds as many layers as the config says (``targets``: every thinker tensor's model name, those
    the model has no place for included: layers beyond the config's depth)."""
    for pattern, sub, depth_field, what in _STACKS:
        want = getattr(getattr(config, sub, None), depth_field, None)
        if want is None:
            continue
        found = {int(m.group(1)) for t in targets if (m := pattern.match(t))}
        if found and len(found) != int(want):
            span = f"indices {min(found)}..{max(found)}" if len(found) > 1 else f"index {min(found)}"
            raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix}{sub}.{depth_field} is {want} but the weights hold "
                                             f"{len(found)} {what} ({span}): the config's depth does not "
                                             "match the weights")


def _check_shapes(d: CheckpointDir, meta: dict[str, torch.Tensor], loaded: dict[str, list[str]],
                  patterns: dict[str, str | None], text: PretrainedConfig) -> None:
    for target, keys in loaded.items():
        want = tuple(meta[target].shape)
        if patterns.get(target) is None:
            for key in keys:
                got = d.thinker[key].shape
                if got != want:
                    raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix}{_subconfig(target)} gives {target} the shape "
                                                     f"{list(want)} but {d.where(key)} is {list(got)}: the config's "
                                                     "widths do not match the weights")
            continue
        # fused experts (Qwen3-Omni): (E, 2I, H) from per-expert gate / up (I, H); (E, H, I) from down (H, I)
        fused_gate_up = target.endswith("gate_up_proj")
        per_expert = (want[1] // 2, *want[2:]) if fused_gate_up else tuple(want[1:])
        kinds = ("gate_proj", "up_proj") if fused_gate_up else ("down_proj",)
        for kind in kinds:
            group = [k for k in keys if f".{kind}." in k]
            if len(group) != want[0]:
                raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix}text_config.num_experts is {want[0]} but the "
                                                 f"weights hold {len(group)} experts' {kind} for {target} (e.g. "
                                                 f"{d.where(sorted(keys, key=_natural)[0])})")
            for key in group:
                if d.thinker[key].shape != per_expert:
                    raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix}text_config (moe_intermediate_size / "
                                                     f"hidden_size) gives each expert's {kind} the shape "
                                                     f"{list(per_expert)} but {d.where(key)} is "
                                                     f"{list(d.thinker[key].shape)}")


# -- tokenizer and processor -----------------------------------------------------------------------------------------

def check_tokenizer_files(path: str | Path) -> None:
    """The files ``AutoTokenizer`` needs: ``tokenizer_config.json`` and ``tokenizer.json`` (or Qwen's
    ``vocab.json`` + ``merges.txt``)."""
    path = Path(path)
    if not (path / TOKENIZER_CONFIG_FILE).is_file():
        raise _fail(path / TOKENIZER_CONFIG_FILE, "missing: the tokenizer's settings (class, eos / pad, media-token "
                                                  "names) are not known", missing=True)
    if (path / "tokenizer.json").is_file():
        return
    vocab, merges = (path / "vocab.json").is_file(), (path / "merges.txt").is_file()
    if vocab and not merges:
        raise _fail(path / "merges.txt", "missing: vocab.json without merges.txt (and no tokenizer.json) cannot "
                                         "build the BPE tokenizer", missing=True)
    if merges and not vocab:
        raise _fail(path / "vocab.json", "missing: merges.txt without vocab.json (and no tokenizer.json) cannot "
                                         "build the BPE tokenizer", missing=True)
    if not vocab:
        raise _fail(path / "tokenizer.json", "missing: the directory holds no tokenizer (tokenizer.json, or "
                                             "vocab.json + merges.txt)", missing=True)


def _tokenizer_file(path: Path) -> Path:
    return path / "tokenizer.json" if (path / "tokenizer.json").is_file() else path / "vocab.json"


#: the thinker config's media token ids, checked against the tokenizer's
_CONFIG_TOKEN_FIELDS = {"image_token": "image_token_id", "video_token": "video_token_id",
                        "audio_token": "audio_token_id", "vision_bos_token": "vision_start_token_id",
                        "vision_eos_token": "vision_end_token_id", "audio_bos_token": "audio_start_token_id",
                        "audio_eos_token": "audio_end_token_id"}
_CONFIG_SPELLING = {"image_token_id": "image_token_index", "video_token_id": "video_token_index",
                    "audio_token_id": "audio_token_index"}  # Qwen2.5-Omni's config.json spelling


def media_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, tuple[str, int | None]]:
    """``{attr: (token, id or None)}`` for each media token the processor uses (the tokenizer's attribute, else the
    Qwen2.5-Omni spelling)."""
    out: dict[str, tuple[str, int | None]] = {}
    for attr, default in MEDIA_TOKENS.items():
        token = str(getattr(tokenizer, attr, None) or default)
        token_id = tokenizer.convert_tokens_to_ids(token)
        out[attr] = (token, None if token_id is None or token_id == tokenizer.unk_token_id else int(token_id))
    return out


def check_tokenizer(d: CheckpointDir, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> None:
    """The tokenizer fits the model: no id beyond the embedding, the media tokens are single tokens with the ids the
    config expects, an eos token."""
    file = _tokenizer_file(d.path)
    vocab = int(config.get_text_config().vocab_size)
    size = len(tokenizer)
    if size > vocab:
        raise _fail(file, f"the tokenizer has {size} tokens (added tokens included) but {d.path / CONFIG_FILE} "
                          f"{d.field_prefix}text_config.vocab_size is {vocab}: ids >= {vocab} have no embedding row")
    for attr, (token, token_id) in media_token_ids(tokenizer).items():
        if token_id is None:
            named = "as tokenizer_config.json names it" if getattr(tokenizer, attr, None) else "Qwen2.5-Omni's spelling"
            raise _fail(file, f"no single token {token!r} ({attr}, {named}): the processor marks media with it; "
                              f"name the tokenizer's own in tokenizer_config.json extra_special_tokens.{attr}")
        name = _CONFIG_TOKEN_FIELDS[attr]
        want = getattr(config, name, None)
        if want is not None and int(want) != token_id:
            spelled = _CONFIG_SPELLING.get(name, name) if d.family.name == "qwen2_5_omni" else name
            raise _fail(d.file(CONFIG_FILE), f"{d.field_prefix}{spelled} is {want} but the tokenizer ({file.name}) "
                                             f"gives {token!r} the id {token_id}: the model would not find its media")
    if tokenizer.eos_token_id is None:
        raise _fail(d.path / TOKENIZER_CONFIG_FILE, "eos_token: missing (generation could not stop)")


def check_processor(d: CheckpointDir, config: PretrainedConfig, processor: Any) -> None:
    """The processor cuts media as the towers expect: patch, temporal patch and merge sizes as the vision config's,
    mel bins as the audio config's."""
    vision, audio = getattr(config, "vision_config", None), getattr(config, "audio_config", None)
    file = d.path / PREPROCESSOR_FILE
    pairs = [("patch_size", processor.patch_size, vision, "patch_size"),
             ("temporal_patch_size", processor.temporal_patch_size, vision, "temporal_patch_size"),
             ("merge_size", processor.merge_size, vision, "spatial_merge_size"),
             ("feature_size", processor.feature_extractor.feature_size, audio, "num_mel_bins")]
    for key, ours, sub, field_name in pairs:
        want = getattr(sub, field_name, None)
        if want is not None and int(want) != int(ours):
            sub_name = "vision_config" if sub is vision else "audio_config"
            raise _fail(file, f"{key} is {ours} but {d.path / CONFIG_FILE} {d.field_prefix}{sub_name}.{field_name} "
                              f"is {want}: the towers would get inputs of the wrong shape")
