"""A published model's stand-in through every path a user's first GPU hour takes, on one device: ``python -m
relax_gym.trainer.tools.model_check --device cuda|cpu [--name qwen2.5-omni-3b] [--layers N] [--standin DIR]
[--out DIR] [--keep] [--budget-s S] [--freeze-vocab]``.

Issue 34's items 2-4 at full depth (36 layers per stack for Qwen2.5-Omni-3B unless ``--layers`` cuts it), in six
parts, each timed and guarded (a failure is recorded and the next part runs when what it needs exists):

a. ``standin``: write the stand-in in the published layout (:func:`~relax_gym.trainer.models.standin.write_standin`:
   full Omni config, sharded safetensors with the ``thinker.`` prefix, Qwen's tokenizer and processor files;
   ~13.9 GB at full depth, bf16 plus the vocoder's float32) -- or take ``--standin DIR`` as it is;
b. ``load``: :func:`~relax_gym.trainer.models.check.check_directory` says OK, then
   ``build_policy(PolicyConfig(path=DIR, dtype="bfloat16"))`` loads the thinker, which goes to the device;
c. ``logits``: one image + audio conversation rendered by :func:`relax_gym.omni.render.render` with the loaded
   :class:`~relax_gym.trainer.policy.processor.OmniProcessor`, and by the official path (transformers'
   ``Qwen2_5OmniProcessor`` built from the directory's files with ``Qwen2VLImageProcessorPil`` and
   ``WhisperFeatureExtractor``, its chat template applied): input ids and every media tensor identical first, then
   one forward of each through the thinker in fp32 on the device (TF32 off): max |logits diff| <= :data:`TOLERANCE`;
d. ``conversion``: the thinker becomes the megatron actor's (``MegatronActor``: megatron-core's ``GPTModel`` as the
   text decoder, TP1, in this process, on the device); the HF-named weights it gives back equal the directory's
   tensors bit for bit (every tensor, read from the safetensors by its checkpoint name);
e. ``train``: one ``sft_step`` of that actor on the conversation with an answer (AdamW over every parameter, the
   weights in bf16, lr :data:`LR`): the loss finite; weights of the text decoder, the head and both towers changed
   (against the directory's tensors). The norms' scales (1.0) do not move in one bf16 step of this size (their
   ulp is 2^-7): the JSON counts changed tensors per part. ``--freeze-vocab`` leaves the two vocabulary-sized
   matrices (embedding, head) out of the step -- no gradients, no Adam moments: the CPU dry run's memory knob (on the
   1-layer stand-in the check peaks at 7.8 GiB RSS with them, in the step; at 4.3 GiB without, in part c);
f. ``checkpoint``: the trained thinker saved with ``save_policy`` and loaded back with ``build_policy`` (dtype
   ``auto``): bf16 kept, every tensor bit-identical.

A budget (``--budget-s``, default 420) bounds the whole: a part that is still running when it is spent is stopped
(``SIGALRM``; a long C call ends first), a part that would start with less than :data:`MIN_PART_S` seconds left is
skipped, and the JSON says which. ``--device cuda`` reports the GPU memory each part peaked at
(``torch.cuda.max_memory_allocated``); both devices report this process's peak RSS. Files the check writes go
under ``--out`` (default: a temporary directory) and are removed at the end unless ``--keep``; a ``--standin``
directory is only read.

The official video processor (``Qwen2VLVideoProcessor``) needs torchvision, which the CPU test environment cannot
import; the conversation has no video, so where torchvision is missing the official processor is given
transformers' generic ``BaseVideoProcessor``, which it never calls (the JSON says which one it got).

One JSON line on stdout (``{"ok": ..., "parts": {...}}``); exit 0 when every part passed, 1 when one failed or was
skipped, 2 when the device cannot be used or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_BUDGET_S", "LR", "MIN_PART_S", "PARTS", "TOLERANCE", "headline", "main", "run_check"]

TOLERANCE = 1e-4  # max |logits diff| of the two renderings' forwards, fp32 (identical inputs: 0 expected)
LR = 1e-3  # one AdamW step on bf16 weights: a smaller step rounds away on most weights of size ~0.02
DEFAULT_BUDGET_S = 420
MIN_PART_S = 5  # a part is not started with less time than this left
PARTS = ("standin", "load", "logits", "conversion", "train", "checkpoint")
OFFICIAL_PROCESSORS = {"qwen2_5_omni": "Qwen2_5OmniProcessor", "qwen3_omni_moe": "Qwen3OmniMoeProcessor"}
QUESTION = "What do you see and hear?"
ANSWER = "<think>A gradient and a tone.</think><answer>a gradient; a tone</answer>"
IMAGE_HW = (168, 224)  # a multiple of 28 (and of 32): neither side resizes it
AUDIO_SECONDS, AUDIO_RATE = 1.3, 16_000


class BudgetSpent(BaseException):
    """The check's budget ran out while a part was running. A ``BaseException``, as ``KeyboardInterrupt`` is: code
    that records any ``Exception`` as its own failure (``check_directory`` does) lets it through."""


@dataclass
class Budget:
    """Seconds for the whole check, from ``start``."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    @contextlib.contextmanager
    def alarm(self) -> Iterator[None]:
        """Raise :class:`BudgetSpent` in this (main) thread when the budget runs out."""
        def ring(signum: int, frame: Any) -> None:
            raise BudgetSpent(f"the {self.seconds:g} s budget ran out")

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@dataclass
class State:
    """What the parts hand each other."""

    device: str
    name: str
    layers: int | None
    work: Path
    standin: Path | None = None
    model: Any = None  # the HF thinker (parts b, c), then converted in place by d
    processor: Any = None
    names: dict[str, str] | None = None  # thinker state_dict key -> checkpoint tensor name (the directory's)
    actor: Any = None  # the megatron actor (d, e)
    freeze_vocab: bool = False  # e trains every parameter but the embedding and the head (a CPU memory knob)
    trained: bool = False
    media: Any = None


# -- helpers --------------------------------------------------------------------------------------------------------

def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _rss_mib() -> float | None:
    """This process's resident set size now (Linux; None elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


def _same_bits(a: Any, b: Any) -> bool:
    """Bit-identical tensors (dtype, shape, bytes): ``torch.equal`` would call -0.0 and 0.0 equal."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 2:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _checkpoint_tensors(directory: Path, wanted: dict[str, str], device: Any) -> Iterator[tuple[str, Any]]:
    """``(state key, tensor)`` for every ``wanted`` key (state key -> checkpoint name), read one at a time from the
    directory's safetensors (the index names the shard) and put on ``device``."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        weight_map = {n: "model.safetensors" for n in wanted.values()}
    by_shard: dict[str, list[str]] = {}
    for key, name in wanted.items():
        if name not in weight_map:
            raise KeyError(f"{index}: no tensor {name!r} (the thinker's {key})")
        by_shard.setdefault(weight_map[name], []).append(key)
    for shard, keys in sorted(by_shard.items()):
        with safe_open(str(directory / shard), framework="pt") as f:
            for key in keys:
                yield key, f.get_tensor(wanted[key]).to(device)


def _part_of(key: str) -> str:
    """Which part of the thinker a state key belongs to (for the training report)."""
    if key.startswith("model.visual.") or key.startswith("visual."):
        return "vision"
    if key.startswith("model.audio_tower.") or key.startswith("audio_tower."):
        return "audio"
    if key.startswith("lm_head."):
        return "head"
    return "text"


def _compare_to_directory(state: dict[str, Any], directory: Path, names: dict[str, str]) -> dict[str, Any]:
    """``state`` (HF keys) against the directory's tensors: which keys are missing, which differ."""
    differ: list[str] = []
    device = next(iter(state.values())).device
    for key, expected in _checkpoint_tensors(directory, {k: names[k] for k in state if k in names}, device):
        if not _same_bits(state[key].detach(), expected):
            differ.append(key)
        del expected
    return {"missing": sorted(set(names) - set(state)), "unexpected": sorted(set(state) - set(names)), "differ": differ}


def _cuda_peak(device: str, reset: bool = False) -> float | None:
    import torch

    if device != "cuda":
        return None
    peak = _gib(torch.cuda.max_memory_allocated())
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


# -- the media and the two renderings -------------------------------------------------------------------------------

@dataclass
class Media:
    image: Any  # uint8 (H, W, 3)
    audio: Any  # float32 (N,) at AUDIO_RATE


def _media() -> Media:
    """A smooth image with noise and a tone with an overtone: deterministic, no file, no codec."""
    import numpy as np

    rng = np.random.default_rng(34)
    h, w = IMAGE_HW
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack([xx % 256, (yy * 3) % 256, (xx + yy) % 256], -1) + rng.integers(0, 30, (h, w, 3))
    t = np.arange(int(AUDIO_SECONDS * AUDIO_RATE)) / AUDIO_RATE
    audio = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.1 * np.sin(2 * np.pi * 990 * t)
    return Media(np.clip(image, 0, 255).astype(np.uint8), audio.astype(np.float32))


def _messages(media: Media, answer: bool) -> list[Any]:
    from relax_gym.omni import AudioPart, ImagePart, Message, TextPart

    user = Message("user", (ImagePart.of(media.image, max_pixels=None),
                            AudioPart.of(media.audio, rate_of_array=AUDIO_RATE), TextPart(QUESTION)))
    return [user, Message("assistant", (TextPart(ANSWER),))] if answer else [user]


def _ours(processor: Any, media: Media) -> dict[str, Any]:
    from relax_gym.omni.render import render

    batch = processor.collate([render(_messages(media, answer=False), processor, cache=None)], padding_side="left")
    batch.pop("loss_mask")
    return batch


@contextlib.contextmanager
def _video_processor_class_known() -> Iterator[None]:
    """transformers checks a processor's video processor against ``transformers.VideoProcessorMixin``, which the
    package exports only when torchvision imports; lend it for the construction."""
    import transformers
    import transformers.video_processing_utils as video_utils

    had = "VideoProcessorMixin" in transformers.__dict__
    if not had:
        transformers.VideoProcessorMixin = video_utils.VideoProcessorMixin
    try:
        yield
    finally:
        if not had:
            del transformers.VideoProcessorMixin


def _official_processor(directory: Path, family: str) -> tuple[Any, str]:
    """transformers' own processor for ``family``, built from ``directory``'s files; and the video processor's
    class name (see the module doc)."""
    import transformers
    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.utils import import_utils

    template = None
    for name in ("chat_template.jinja", "chat_template.json"):
        path = directory / name
        if path.is_file():
            text = path.read_text()
            template = json.loads(text)["chat_template"] if name.endswith(".json") else text
            break
    video: Any = None
    if import_utils.is_torchvision_available():
        try:
            from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

            video = Qwen2VLVideoProcessor.from_pretrained(str(directory))
        except Exception as exc:  # noqa: BLE001 - a torchvision that does not load beside this torch: as if absent
            print(f"model_check: Qwen2VLVideoProcessor unavailable ({type(exc).__name__}: {exc}); the conversation "
                  "has no video, using BaseVideoProcessor", file=sys.stderr)
    if video is None:
        import transformers.video_processing_utils as video_utils

        video = video_utils.BaseVideoProcessor()
    with _video_processor_class_known():
        processor = getattr(transformers, OFFICIAL_PROCESSORS[family])(
            image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(directory)),
            video_processor=video,
            feature_extractor=WhisperFeatureExtractor.from_pretrained(str(directory)),
            tokenizer=AutoTokenizer.from_pretrained(str(directory)),
            chat_template=template)
    return processor, type(video).__name__


def _theirs(processor: Any, media: Media) -> dict[str, Any]:
    from PIL import Image

    dicts = [{"role": "user", "content": [{"type": "image", "image": "image"}, {"type": "audio", "audio": "audio"},
                                          {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True)
    return dict(processor(text=[text], images=[Image.fromarray(media.image)], audio=[media.audio], return_tensors="pt"))


def _input_differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    import torch

    out = []
    if sorted(ours) != sorted(theirs):
        out.append(f"keys: ours {sorted(ours)}, official {sorted(theirs)}")
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{key}: ours {a.dtype} {tuple(a.shape)}, official {b.dtype} {tuple(b.shape)}")
        elif not torch.equal(a, b):
            out.append(f"{key}: max |diff| {float((a.double() - b.double()).abs().max()):.3g}")
    return out


# -- the parts --------------------------------------------------------------------------------------------------------

def part_standin(s: State, out: dict[str, Any]) -> None:
    from relax_gym.trainer.models.standin import write_standin

    if s.standin is not None:
        out.update(written=False, path=str(s.standin))
    else:
        t0 = time.perf_counter()
        s.standin = write_standin(s.name, s.work / "standin", layers=s.layers or _full_depth(s.name))
        out.update(written=True, path=str(s.standin), write_s=round(time.perf_counter() - t0, 1))
    files = [p for p in s.standin.iterdir() if p.is_file()]
    out.update(files=len(files), bytes=sum(p.stat().st_size for p in files),
               shards=sum(p.suffix == ".safetensors" for p in files))
    out["ok"] = out["shards"] > 0


def part_load(s: State, out: dict[str, Any]) -> None:
    import torch

    from relax_gym.trainer.dcs import checkpoint_names
    from relax_gym.trainer.models.check import check_directory
    from relax_gym.trainer.policy import PolicyConfig, build_policy

    t0 = time.perf_counter()
    report = check_directory(s.standin)
    out["check_s"] = round(time.perf_counter() - t0, 1)
    out["check"] = "OK" if report.ok else f"error: {report.error}"
    out["architecture"] = {k: v for k, v in report.architecture.items() if k != "skipped"}
    out["text"] = report.text
    if report.weights:
        out["parameters"] = report.weights.get("parameters")
    if not report.ok:
        out["ok"] = False
        return
    t0 = time.perf_counter()
    model, processor = build_policy(PolicyConfig(path=str(s.standin), family=report.architecture["family"],
                                                 dtype="bfloat16"))
    out["build_policy_s"] = round(time.perf_counter() - t0, 1)
    s.names = checkpoint_names(model)  # before the megatron conversion renames anything
    t0 = time.perf_counter()
    model.to(s.device)
    if s.device == "cuda":
        torch.cuda.synchronize()
    out["to_device_s"] = round(time.perf_counter() - t0, 1)
    params = list(model.parameters())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    out.update(dtype=dtypes, thinker_parameters=sum(p.numel() for p in params),
               thinker_bytes=sum(p.numel() * p.element_size() for p in params),
               layers=int(model.config.get_text_config().num_hidden_layers), tensors=len(s.names))
    if s.device == "cuda":
        out["gpu_allocated_gib"] = _gib(torch.cuda.memory_allocated())
    s.model, s.processor = model, processor
    out["ok"] = dtypes == ["bfloat16"] and out["parameters"] == out["thinker_parameters"]


def part_logits(s: State, out: dict[str, Any]) -> None:
    import torch

    s.media = _media()
    t0 = time.perf_counter()
    ours = _ours(s.processor, s.media)
    out["render_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    official, video_processor = _official_processor(s.standin, s.model.config.model_type.removesuffix("_thinker"))
    theirs = _theirs(official, s.media)
    out.update(official_s=round(time.perf_counter() - t0, 2), official_processor=type(official).__name__,
               official_video_processor=video_processor)
    ids = ours["input_ids"][0].tolist()
    out.update(tokens=len(ids), image_tokens=ids.count(s.processor.image_token_id),
               audio_tokens=ids.count(s.processor.audio_token_id), tolerance=TOLERANCE)
    differences = _input_differences(ours, theirs)
    out["inputs_identical"] = not differences
    if differences:
        out.update(ok=False, input_differences=differences)
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 matmuls and convolutions
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    s.model.float()
    try:
        with torch.no_grad():
            logits = [s.model(**{k: v.to(s.device) if isinstance(v, torch.Tensor) else v
                                 for k, v in batch.items()}).logits for batch in (ours, theirs)]
        gap = float((logits[0] - logits[1]).abs().max())
        out.update(forward_s=round(time.perf_counter() - t0, 2), logits_max_abs_diff=gap,
                   logits_shape=list(logits[0].shape), logits_finite=bool(torch.isfinite(logits[0]).all()))
        del logits
    finally:
        s.model.to(torch.bfloat16)  # exact: every value came from bf16
    out["ok"] = gap <= TOLERANCE and out["logits_finite"]


def part_conversion(s: State, out: dict[str, Any]) -> None:
    from relax_gym.trainer.actors.megatron.actor import MegatronActor

    t0 = time.perf_counter()
    model, s.model = s.model, None
    s.actor = MegatronActor(model, s.processor, lr=LR, micro_batch_size=4)
    del model
    out["convert_s"] = round(time.perf_counter() - t0, 1)
    out["actor_device"] = str(s.actor.device)
    t0 = time.perf_counter()
    state = s.actor.state_dict()
    out["gather_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    found = _compare_to_directory(state, s.standin, s.names)
    out["compare_s"] = round(time.perf_counter() - t0, 1)
    del state
    out.update(tensors=len(s.names), missing=found["missing"][:5], unexpected=found["unexpected"][:5],
               differ=found["differ"][:5], differ_count=len(found["differ"]))
    out["bit_exact"] = not (found["missing"] or found["unexpected"] or found["differ"])
    out["ok"] = out["bit_exact"]


def part_train(s: State, out: dict[str, Any]) -> None:
    import torch

    from relax_gym.omni.render import render

    item = render(_messages(s.media or _media(), answer=True), s.processor, add_generation_prompt=False, cache=None)
    trained, required = "every parameter", ("text", "head", "vision", "audio")
    if s.freeze_vocab:  # no gradients, so AdamW keeps no moments for them and leaves them as they are
        from relax_gym.trainer.actors.megatron.model import gpt_of

        gpt = gpt_of(s.actor.model)
        gpt.embedding.word_embeddings.weight.requires_grad_(False)
        if getattr(gpt, "output_layer", None) is not None and gpt.output_layer.weight is not None:
            gpt.output_layer.weight.requires_grad_(False)
        trained, required = "every parameter but the input embedding and the output head (--freeze-vocab)", (
            "text", "vision", "audio")
    out.update(what=f"MegatronActor.sft_step: megatron-core GPTModel text decoder, AdamW over {trained}, bf16 weights",
               lr=LR, tokens=len(item.input_ids), loss_tokens=item.num_loss_tokens)
    t0 = time.perf_counter()
    metrics = s.actor.sft_step([item])
    if s.device == "cuda":
        torch.cuda.synchronize()
    out["step_s"] = round(time.perf_counter() - t0, 2)
    s.trained = True
    out.update(loss=metrics["sft_nll"], grad_norm=metrics["grad_norm"])
    t0 = time.perf_counter()
    state = s.actor.state_dict()
    found = _compare_to_directory(state, s.standin, s.names)
    out["compare_s"] = round(time.perf_counter() - t0, 1)
    changed: dict[str, list[int]] = {}
    differ = set(found["differ"])
    for key in state:
        tally = changed.setdefault(_part_of(key), [0, 0])
        tally[0] += key in differ
        tally[1] += 1
    del state
    out["changed"] = {part: f"{n} of {total}" for part, (n, total) in sorted(changed.items())}
    moved = {part: n > 0 for part, (n, _) in changed.items()}
    out["ok"] = math.isfinite(out["loss"]) and all(moved.get(p, False) for p in required)


def part_checkpoint(s: State, out: dict[str, Any]) -> None:
    import torch

    from relax_gym.trainer.policy import PolicyConfig, build_policy, save_policy

    out["weights"] = "trained (part e)" if s.trained else "as converted (part e did not step)"
    t0 = time.perf_counter()
    template = s.actor.hf_template
    state = {k: v.detach().to("cpu") for k, v in s.actor.state_dict().items()}
    s.actor.close()
    s.actor = None
    with torch.device("meta"):  # no init: every tensor is loaded below (non-persistent buffers are not saved)
        model = type(template)(template.config)
    model = model.to(next(iter(state.values())).dtype).to_empty(device="cpu")
    model.load_state_dict(state, strict=True)
    model.generation_config = template.generation_config
    del state
    target = s.work / "trained"
    save_policy(model, s.processor, target)
    out["save_s"] = round(time.perf_counter() - t0, 1)
    out["saved_bytes"] = sum(p.stat().st_size for p in target.iterdir() if p.is_file())
    t0 = time.perf_counter()
    loaded, _ = build_policy(PolicyConfig(path=str(target)))  # dtype auto: the checkpoint's own
    out["reload_s"] = round(time.perf_counter() - t0, 1)
    mine, theirs = model.state_dict(), loaded.state_dict()
    differ = [k for k in mine if k not in theirs or not _same_bits(mine[k], theirs[k])]
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in theirs.values() if t.is_floating_point()})
    out.update(reloaded_dtype=dtypes, tensors=len(mine), differ=differ[:5], differ_count=len(differ),
               bit_identical=not differ and sorted(mine) == sorted(theirs))
    out["ok"] = out["bit_identical"] and dtypes == ["bfloat16"]


#: part -> (function, the parts it needs to have passed)
_RUN: dict[str, tuple[Callable[[State, dict[str, Any]], None], tuple[str, ...]]] = {
    "standin": (part_standin, ()),
    "load": (part_load, ("standin",)),
    "logits": (part_logits, ("load",)),
    "conversion": (part_conversion, ("load",)),
    "train": (part_train, ("conversion",)),
    "checkpoint": (part_checkpoint, ("conversion",)),
}


def _full_depth(name: str) -> int:
    from relax_gym.trainer.models.published import PUBLISHED

    return int(PUBLISHED[name].config["thinker_config"]["text_config"]["num_hidden_layers"])


def run_check(device: str, name: str = "qwen2.5-omni-3b", *, layers: int | None = None, standin: Path | None = None,
              work: Path, budget_s: float = DEFAULT_BUDGET_S, freeze_vocab: bool = False) -> dict[str, Any]:
    """Run every part; the report (``ok``, ``parts``, ``failures``, ``seconds``)."""
    import torch

    budget = Budget(budget_s)
    state = State(device=device, name=name, layers=layers, work=work, standin=standin,
                  freeze_vocab=freeze_vocab)
    parts: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    spent = False
    for part in PARTS:
        fn, needs = _RUN[part]
        out: dict[str, Any] = {"ok": False}
        parts[part] = out
        blocked = [p for p in needs if not parts[p].get("ok")]
        if part == "checkpoint" and state.actor is None:
            blocked = blocked or ["conversion"]
        if spent or budget.left() < MIN_PART_S:
            out["skipped"] = f"the {budget_s:g} s budget is spent ({max(budget.left(), 0):.0f} s left)"
        elif blocked:
            out["skipped"] = f"needs {', '.join(blocked)}, which did not pass"
        if "skipped" in out:
            failures.append(f"{part}: skipped: {out['skipped']}")
            continue
        _cuda_peak(device, reset=True)
        t0 = time.perf_counter()
        try:
            with budget.alarm():
                fn(state, out)
        except BudgetSpent as exc:
            spent = True
            out.update(ok=False, error=f"stopped: {exc} after {time.perf_counter() - t0:.0f} s in this part")
        except Exception as exc:  # noqa: BLE001 - recorded; the next part runs where it can
            traceback.print_exc()
            out.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:500]}")
        out["seconds"] = round(time.perf_counter() - t0, 2)
        if device == "cuda":
            out["gpu_peak_gib"] = _cuda_peak(device)
        out["peak_rss_mib"], out["rss_mib"] = _peak_rss_mib(), _rss_mib()
        if not out.get("ok"):
            failures.append(f"{part}: {out.get('error') or 'check failed'}")
        print(f"model_check: {part}: {'ok' if out.get('ok') else 'FAILED'} in {out['seconds']} s", file=sys.stderr,
              flush=True)
    if state.actor is not None:
        state.actor.close()
    return {"ok": not failures, "device": device, "name": name,
            "layers": parts["load"].get("layers", layers), "budget_s": budget_s,
            "seconds": round(time.monotonic() - budget.start, 1), "failures": failures,
            "headline": headline(parts), "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "peak_rss_mib": _peak_rss_mib(), "parts": parts}


def headline(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures a reader wants first (gpu_check.sh's table shows the start of the line): seconds per part
    ("skipped" where it did not run), the thinker's size, the parity gap, the exactness flags, the loss, the peaks."""
    load, logits, train = parts.get("load", {}), parts.get("logits", {}), parts.get("train", {})
    gpu = [p["gpu_peak_gib"] for p in parts.values() if p.get("gpu_peak_gib") is not None]
    return {
        "part_seconds": {k: "skipped" if "skipped" in v else v.get("seconds") for k, v in parts.items()},
        "thinker_gib": _gib(load["thinker_bytes"]) if "thinker_bytes" in load else None,
        "logits_max_abs_diff": logits.get("logits_max_abs_diff"), "inputs_identical": logits.get("inputs_identical"),
        "conversion_bit_exact": parts.get("conversion", {}).get("bit_exact"), "train_loss": train.get("loss"),
        "train_step_s": train.get("step_s"),
        "checkpoint_bit_identical": parts.get("checkpoint", {}).get("bit_identical"),
        "gpu_peak_gib": max(gpu) if gpu else None,
        "peak_rss_mib": max((p["peak_rss_mib"] for p in parts.values() if "peak_rss_mib" in p), default=None),
    }


def _standin_depth(directory: Path) -> int | None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("thinker_config", config).get("text_config", {})
    return text.get("num_hidden_layers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.trainer.tools.model_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--name", default="qwen2.5-omni-3b", help="a published model (default qwen2.5-omni-3b)")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers per stack of the stand-in (default: full depth)")
    parser.add_argument("--standin", type=Path, default=None,
                        help="check this stand-in (or checkpoint) directory instead of writing one")
    parser.add_argument("--out", type=Path, default=None, help="where files go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the files written under --out")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds for it all (default {DEFAULT_BUDGET_S})")
    parser.add_argument("--freeze-vocab", action="store_true",
                        help="train every parameter but the two vocabulary-sized matrices, input embedding and output "
                             "head (spares their gradients and Adam moments: the CPU dry run's memory knob)")
    args = parser.parse_args(argv)
    from relax_gym.trainer.models.published import PUBLISHED

    if args.name not in PUBLISHED:
        parser.error(f"--name: unknown published model {args.name!r}; known: {', '.join(sorted(PUBLISHED))}")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers must be >= 1")
    if args.budget_s <= 0:
        parser.error("--budget-s must be > 0")
    if args.standin is not None:
        if not args.standin.is_dir():
            parser.error(f"--standin: {args.standin} is not a directory")
        depth = _standin_depth(args.standin)
        if args.layers is not None and depth is not None and depth != args.layers:
            parser.error(f"--standin {args.standin} has {depth} text layers, not --layers {args.layers}")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch looks: the check runs on the CPU even on a GPU host
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "device": "cuda", "failures": ["no CUDA device visible to torch"]}))
        return 2
    if args.out is None:
        work, remove = Path(tempfile.mkdtemp(prefix="model-check-")), not args.keep
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        work, remove = Path(tempfile.mkdtemp(prefix="model-check-", dir=args.out)), not args.keep
    try:
        summary = run_check(args.device, args.name, layers=args.layers, standin=args.standin, work=work,
                            budget_s=args.budget_s, freeze_vocab=args.freeze_vocab)
    except Exception as exc:  # noqa: BLE001 - one JSON line whatever broke (the traceback on stderr)
        traceback.print_exc()
        summary = {"ok": False, "device": args.device, "failures": [f"{type(exc).__name__}: {exc}"]}
    finally:
        if remove:
            shutil.rmtree(work, ignore_errors=True)
    summary["files"] = None if remove else str(work)
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
