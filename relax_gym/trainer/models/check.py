"""``relax-gym model check DIR``: what a checkpoint directory holds, on one screen, and whether it loads.

    report = check_directory("/ckpt/Qwen2.5-Omni-3B")          # headers and small files only; no weights read
    print(format_check(report))                                  # ends with "OK" or "error: <one line>"
    check_directory(path, load=True)                             # also loads it for real, as model.path would

It runs the checks ``model.path`` runs before loading (:mod:`~relax_gym.trainer.policy.checkpoint_files`: files,
config against the safetensors headers, every parameter matched to a tensor of its shape on the meta device, the
tokenizer against the embedding and the media-token ids, the processor against the towers) and reports, as far as it
got: architecture (model type, thinker class, talker present), widths (text, experts, vision, audio), dtype (the
config's and the weights' own), shards and bytes, tokenizer (class, size, special tokens with ids, eos / pad), the
chat template (present, and whether it is append-only on a two-turn conversation: relax-gym renders multi-turn
episodes incrementally, see :mod:`relax_gym.omni.render`) and the media limits (image and video pixels, fps, audio
sampling). The family comes from ``model_type``; the report says which ``model.family`` trains it.
"""

from __future__ import annotations

import re
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CheckReport", "TEMPLATE_PROBE", "check_directory", "format_check"]

WIDTH = 118  # columns of the formatted report

#: The two-turn conversation the chat template is checked on (an image, reasoning in the assistant turns: templates
#: that drop earlier <think> blocks fail it).
TEMPLATE_PROBE: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "<think>A cat on a mat.</think><answer>a cat</answer>"}]},
    {"role": "user", "content": [{"type": "text", "text": "What colour is it?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "<think>It is black.</think><answer>black</answer>"}]},
]


@dataclass
class CheckReport:
    """What :func:`check_directory` found. Each section is filled as far as the check got; ``error`` is the one-line
    reason it stopped (None: the directory loads)."""

    path: Path
    error: str | None = None
    architecture: dict[str, Any] = field(default_factory=dict)
    text: dict[str, Any] = field(default_factory=dict)
    vision: dict[str, Any] = field(default_factory=dict)
    audio: dict[str, Any] = field(default_factory=dict)
    dtype: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    tokenizer: dict[str, Any] = field(default_factory=dict)
    template: dict[str, Any] = field(default_factory=dict)
    media: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def check_directory(path: str | Path, *, load: bool = False) -> CheckReport:
    """Check ``path`` as ``model.path`` would load it; ``load=True`` also loads it for real (``build_policy``)."""
    from relax_gym.trainer.policy.checkpoint_files import CheckpointDirError

    report = CheckReport(path=Path(path))
    try:
        _check(report, load)
    except CheckpointDirError as exc:
        report.error = str(exc)
    except Exception as exc:  # anything else transformers raises: still one line, with its type
        report.error = f"{report.path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:600]
    return report


def _check(report: CheckReport, load: bool) -> None:
    from relax_gym.trainer.policy.checkpoint_files import check_weights, read_checkpoint_dir, read_weights, thinker_config
    from relax_gym.trainer.policy.model import load_processor

    d = read_checkpoint_dir(report.path, weights=False)
    report.architecture = {
        "model_type": d.config.get("model_type"), "family": d.family.name, "layout": "full" if d.full else "thinker",
        "thinker_class": d.family.model_class.__name__, "talker": bool(d.full and d.config.get("talker_config")),
        "skipped": {},
    }
    config = thinker_config(d)
    _widths(report, config)
    read_weights(d)
    report.architecture.update(talker=bool(d.full and (d.skipped or d.config.get("talker_config"))),
                               skipped=dict(sorted(d.skipped.items())))
    report.dtype = {"config": d.config_dtype, "thinker_weights": dict(d.dtypes), "all_weights": dict(d.all_dtypes)}
    report.weights = {"shards": len(d.shards), "bytes": d.total_bytes, "thinker_tensors": len(d.thinker),
                      "skipped_tensors": sum(d.skipped.values())}
    weights = check_weights(d, config)
    report.weights["parameters"] = weights.parameters
    if weights.unexpected:
        report.warnings.append(f"{len(weights.unexpected)} thinker tensor(s) the model has no place for (not loaded), "
                               f"e.g. {weights.unexpected[0]}")
    report.load = {"meta": True}
    processor = load_processor(d, config)
    _tokenizer(report, processor)
    _template(report, processor)
    _media(report, d, processor)
    if load:
        _load_for_real(report, d)


def _widths(report: CheckReport, config: Any) -> None:
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    report.text = {
        "hidden_size": int(text.hidden_size), "num_hidden_layers": int(text.num_hidden_layers),
        "num_attention_heads": heads, "num_key_value_heads": int(text.num_key_value_heads),
        "head_dim": int(getattr(text, "head_dim", None) or text.hidden_size // heads),
        "vocab_size": int(text.vocab_size), "intermediate_size": int(text.intermediate_size),
        "tie_word_embeddings": bool(getattr(text, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False)),
    }
    if getattr(text, "num_experts", None):
        report.text.update({"num_experts": int(text.num_experts), "num_experts_per_tok": int(text.num_experts_per_tok),
                            "moe_intermediate_size": int(text.moe_intermediate_size)})
    vision, audio = config.vision_config, config.audio_config
    report.vision = {"depth": int(vision.depth), "hidden_size": int(vision.hidden_size),
                     "num_heads": int(vision.num_heads), "patch_size": int(vision.patch_size),
                     "temporal_patch_size": int(vision.temporal_patch_size),
                     "spatial_merge_size": int(vision.spatial_merge_size), "out_hidden_size": int(vision.out_hidden_size)}
    report.audio = {"encoder_layers": int(audio.encoder_layers), "d_model": int(audio.d_model),
                    "encoder_attention_heads": int(audio.encoder_attention_heads),
                    "num_mel_bins": int(audio.num_mel_bins)}


def _tokenizer(report: CheckReport, processor: Any) -> None:
    from relax_gym.trainer.policy.checkpoint_files import media_token_ids

    tok = processor.tokenizer
    added = sorted((int(i), str(t)) for i, t in tok.added_tokens_decoder.items())
    report.tokenizer = {
        "class": type(tok).__name__, "size": len(tok),
        "eos": (str(tok.eos_token), int(tok.eos_token_id)),
        "pad": (str(tok.pad_token), int(tok.pad_token_id)) if tok.pad_token_id is not None else None,
        "added_tokens": [(t, i) for i, t in added],
        "media_tokens": {attr: token for attr, token in media_token_ids(tok).items()},
    }


def _template(report: CheckReport, processor: Any) -> None:
    from relax_gym.omni.render import TemplateNotAppendOnly, check_append_only

    template = processor.chat_template
    source = next((n for n in ("chat_template.jinja", "chat_template.json") if (report.path / n).is_file()),
                  "tokenizer_config.json" if template else None)
    report.template = {"present": bool(template), "source": source, "append_only": None}
    if not template:
        report.warnings.append("no chat template: conversations cannot be rendered (add chat_template.jinja)")
        return
    try:
        check_append_only(processor, [TEMPLATE_PROBE])
        report.template["append_only"] = True
    except TemplateNotAppendOnly as exc:
        report.template["append_only"] = False
        report.template["detail"] = str(exc).splitlines()[0]
        report.warnings.append("the chat template is not append-only (it rewrites earlier turns): multi-turn "
                               "episodes cannot be rendered incrementally; supply an append-only chat_template.jinja")


def _media(report: CheckReport, d: Any, processor: Any) -> None:
    from relax_gym.trainer.policy.processor import VIDEO_PREPROCESSOR_CONFIG

    fe = processor.feature_extractor
    has_video_config = (d.path / VIDEO_PREPROCESSOR_CONFIG).is_file()
    report.media = {
        "processor_class": processor.processor_class,
        "image_min_pixels": processor.min_pixels, "image_max_pixels": processor.max_pixels,
        "video_min_pixels": processor.video_min_pixels, "video_max_pixels": processor.video_max_pixels,
        "video_fps": processor.default_video_fps,
        "video_source": VIDEO_PREPROCESSOR_CONFIG if has_video_config else "published defaults: no video config",
        "patch_size": processor.patch_size, "merge_size": processor.merge_size,
        "temporal_patch_size": processor.temporal_patch_size,
        "audio_sampling_rate": int(fe.sampling_rate), "audio_mel_bins": int(fe.feature_size),
        "audio_chunk_seconds": int(fe.chunk_length), "audio_token_rule": processor.audio_token_rule,
    }


def _load_for_real(report: CheckReport, d: Any) -> None:
    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    start = time.perf_counter()
    model, _ = build_policy(PolicyConfig(path=str(d.path), family=d.family.name))
    params = list(model.parameters())
    report.load.update({"loaded": True, "seconds": round(time.perf_counter() - start, 1),
                        "dtype": str(params[0].dtype).removeprefix("torch."),
                        "bytes": sum(p.numel() * p.element_size() for p in params)})
    del model, params


# -- formatting ---------------------------------------------------------------------------------------------------

def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} x {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def _fill(head: str, value: str) -> list[str]:
    """``value`` after ``head``, wrapped to :data:`WIDTH` after its commas and semicolons (an item such as
    ``<|IMAGE|>=151655`` stays on one line), a longer piece at its spaces."""
    indent = " " * len(head)
    lines, line = [], head
    for piece in re.split(r"(?<=[,;]) ", value):
        fresh = line in (head, indent)
        if not fresh and len(line) + 1 + len(piece) > WIDTH:
            lines.append(line)
            line, fresh = indent, True
        line += piece if fresh else " " + piece
    lines.append(line)
    out: list[str] = []
    for line in lines:
        out += textwrap.wrap(line, width=WIDTH, subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False, drop_whitespace=False) if len(line) > WIDTH else [line]
    return [line.rstrip() for line in out]


def format_check(report: CheckReport) -> str:
    """The report on one screen; the last line is ``OK`` or ``error: <the one-line error>``."""
    rows: list[tuple[str, str]] = []
    a = report.architecture
    if a:
        talker = (f"talker present ({_counts(a['skipped'])} tensors, not loaded)" if a["talker"]
                  else "no talker (thinker only)")
        rows.append(("architecture", f"{a['model_type']} ({a['layout']} layout); thinker {a['thinker_class']}; {talker}; "
                                     f"train with model.family={a['family']}"))
    t = report.text
    if t:
        experts = (f", {t['num_experts']} experts top-{t['num_experts_per_tok']} x {t['moe_intermediate_size']}"
                   if "num_experts" in t else "")
        rows.append(("text", f"hidden {t['hidden_size']}, layers {t['num_hidden_layers']}, heads "
                             f"{t['num_attention_heads']} / kv {t['num_key_value_heads']}, head_dim {t['head_dim']}, "
                             f"vocab {t['vocab_size']}, intermediate {t['intermediate_size']}{experts}, tied "
                             f"{'yes' if t['tie_word_embeddings'] else 'no'}"))
    if report.vision:
        v = report.vision
        rows.append(("vision", f"depth {v['depth']}, width {v['hidden_size']}, heads {v['num_heads']}, patch "
                               f"{v['patch_size']} (temporal {v['temporal_patch_size']}, merge "
                               f"{v['spatial_merge_size']}), out {v['out_hidden_size']}"))
    if report.audio:
        au = report.audio
        rows.append(("audio", f"layers {au['encoder_layers']}, width {au['d_model']}, heads "
                              f"{au['encoder_attention_heads']}, mel bins {au['num_mel_bins']}"))
    if report.dtype:
        dt = report.dtype
        rows.append(("dtype", f"config {dt['config'] or 'unstated'}; thinker weights {_counts(dt['thinker_weights'])}; "
                              f"all weights {_counts(dt['all_weights'])}"))
    if report.weights:
        w = report.weights
        params = f", {w['parameters'] / 1e9:.3f} B thinker parameters" if "parameters" in w else ""
        rows.append(("weights", f"{w['shards']} shard(s), {_gib(w['bytes'])}; {w['thinker_tensors']} thinker tensors"
                                f"{params}; {w['skipped_tensors']} other tensors not loaded"))
    if report.tokenizer:
        tk = report.tokenizer
        pad = f"{tk['pad'][0]} {tk['pad'][1]}" if tk["pad"] else "none"
        rows.append(("tokenizer", f"{tk['class']}, {tk['size']} tokens; eos {tk['eos'][0]} {tk['eos'][1]}, pad {pad}"))
        rows.append(("added tokens", ", ".join(f"{t}={i}" for t, i in tk["added_tokens"])))
        rows.append(("media tokens", ", ".join(f"{attr.removesuffix('_token')} {tok}={i}"
                                               for attr, (tok, i) in tk["media_tokens"].items())))
    if report.template:
        tp = report.template
        state = {True: "append-only: yes (two-turn conversation)", False: "append-only: NO",
                 None: "append-only: not checked"}[tp["append_only"]]
        rows.append(("chat template", f"{'present' if tp['present'] else 'missing'}"
                                      f"{' (' + tp['source'] + ')' if tp.get('source') else ''}; {state}"))
    if report.media:
        m = report.media
        rows.append(("image", f"min_pixels {m['image_min_pixels']}, max_pixels {m['image_max_pixels']} (patch "
                              f"{m['patch_size']}, merge {m['merge_size']}); {m['processor_class']}"))
        rows.append(("video", f"min_pixels {m['video_min_pixels']}, max_pixels {m['video_max_pixels']}, fps "
                              f"{m['video_fps']:g} (from {m['video_source']})"))
        rows.append(("audio input", f"{m['audio_sampling_rate']} Hz, {m['audio_mel_bins']} mel bins, chunk "
                                    f"{m['audio_chunk_seconds']} s, placeholders by the {m['audio_token_rule']} rule"))
    if report.load:
        ld = report.load
        if ld.get("loaded"):
            rows.append(("loads", f"yes: loaded for real in {ld['seconds']} s ({ld['dtype']}, {_gib(ld['bytes'])})"))
        elif report.ok:
            rows.append(("loads", "yes on the meta device (every parameter has a tensor of its shape); --load loads "
                                  "the weights"))
    for warning in report.warnings:
        rows.append(("warning", warning))
    lines = [str(report.path)]
    for key, value in rows:
        lines += _fill(f"  {key:<13} ", value)
    lines.append("OK" if report.ok else f"error: {report.error}")
    return "\n".join(lines)
