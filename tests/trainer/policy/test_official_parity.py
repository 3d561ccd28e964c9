"""Input parity with the official Qwen-Omni preprocessing, at the published processor configs.

For Qwen2.5-Omni-3B and Qwen3-Omni-30B-A3B (the preprocessor_config.json, tokenizer and chat template of
``relax_gym.trainer.models.published``; the tokenizer built as their stand-ins write it), conversations with
images, a video, audio clips and a video with its audio track (``use_audio_in_video``) are rendered twice:

- ours: ``relax_gym.omni.render`` with our ``OmniProcessor`` (video parts decoded with
  ``VideoSampling.qwen_omni()``, images with ``ImageSampling(max_pixels=None)``: sized by the processor alone);
- official: qwen-omni-utils 0.0.9's ``process_mm_info`` (media loading, ``fetch_image``, ``fetch_video``:
  ``smart_nframes``, frame indices, ``smart_resize``, the bicubic resize), the processor's chat template, then
  transformers' ``Qwen2_5OmniProcessor`` / ``Qwen3OmniMoeProcessor`` built from ``Qwen2VLImageProcessorPil``,
  ``Qwen2VLVideoProcessor`` and ``WhisperFeatureExtractor`` with the published settings;

and compared: input ids identical, every media tensor identical (``pixel_values``, ``image_grid_thw``,
``pixel_values_videos``, ``video_grid_thw``, ``video_second_per_grid``, ``input_features``,
``feature_attention_mask``; the one exception, Qwen3-Omni's padding of several clips, is explained in its test),
and the 3-D rope positions that transformers' own thinker (``get_rope_index``, the published thinker config on the
meta device: it reads only ids, grids and config) computes from each side's tensors identical.

What runs for real and what does not (details in the stand-in's notes below): everything named above runs as
published except torchvision, which cannot be imported beside our CPU torch (PyPI's torchvision wheels link CUDA
torch: "operator torchvision::nms does not exist"). transformers' video processor and qwen-omni-utils' vision
module import it at module level, so they are imported with a stand-in ``torchvision`` holding the few functions
they call (two resizes, normalize, grayscale_to_rgb, read_video), each transcribed from torchvision's source; the
stand-in leaves ``sys.modules`` right after the import. Audio files are read by librosa on the official side
(WAV here, one at 44.1 kHz stereo: mixed down and resampled with soxr). What is not compared: the decoding of a
video's audio track, which qwen-omni-utils reads through audioread and the ``ffmpeg`` program, absent here; the
official processor is handed the track our decoder produced (its path for callers that decoded the track).

Cost, measured on a shared 2-core machine under a load of 4 to 7: 23 to 75 s of test time, peak RSS 1.2 GB. Most of
it is librosa's first load (it imports scipy.signal) and Qwen2.5-Omni's audio features, which the published
300 s chunk pads to 30,000 frames per clip (about 1 s of CPU each, on both sides).
"""

from __future__ import annotations

import contextlib
import json
import enum
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import Qwen2_5OmniProcessor, WhisperFeatureExtractor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from relax_gym.envs.synth import write_moving_square_video
from relax_gym.omni import (AudioPart, AudioSampling, ImagePart, ImageSampling, MediaSource, Message, TextPart, VideoPart,
                             VideoSampling)
from relax_gym.omni.decode import resize_frames, video_from_array
from relax_gym.omni.render import render
from relax_gym.omni.sampling import QwenVideoRule
from relax_gym.trainer.models.published import PUBLISHED, published_config
from relax_gym.trainer.policy.processor import OmniProcessor, _chunk_sizes

# ============================================================================================== official stand-in

# The official Qwen-Omni preprocessing, run here although torchvision cannot be.
#
# What cannot run as published, and why: PyPI's torchvision wheels link a CUDA build of torch; beside the CPU torch
# this project pins, ``import torchvision`` fails ("operator torchvision::nms does not exist"). Two official modules
# import it at module level:
#
# - ``transformers.models.qwen2_vl.video_processing_qwen2_vl`` (the video processor of both Omni processors:
#   ``import torchvision.transforms.v2.functional as tvF``), and the torchvision backend it builds on
#   (``transformers.image_processing_backends.TorchvisionBackend`` and ``video_processing_utils``, which read a
#   module global ``tvF`` that only exists when torchvision imports);
# - ``qwen_omni_utils.v2_5.vision_process`` (``import torchvision``, ``from torchvision import io, transforms``).
#
# :func:`official_modules` imports those modules for real with a stand-in ``torchvision`` in ``sys.modules`` for
# the import only, then takes it out again (nothing else in the process sees it), and for as long as the caller
# holds the context lends the two transformers modules a ``tvF`` (and the package the ``VideoProcessorMixin`` the
# processors check their video processor against, which it exports only with torchvision). The stand-in holds
# only the leaves those modules call, each transcribed from torchvision's source (``torchvision/transforms/v2/functional/_geometry.py``,
# ``_misc.py``, ``_color.py``; ``torchvision/transforms/functional.py`` and ``_functional_tensor.py``; ``io/video.py``):
#
# - ``transforms.v2.functional.resize`` (``resize_image``): returns the input when the size is unchanged; float
#   input → ``interpolate(mode, align_corners=False, antialias)``; uint8 with bicubic on CPU → the same on the uint8
#   tensor (torch's native uint8 kernel);
# - ``transforms.v2.functional.normalize`` (``normalize_image``): ``image.sub(mean).div_(std)``;
# - ``transforms.v2.functional.grayscale_to_rgb``: a 3-channel image as is;
# - ``transforms.functional.resize`` (v1, what qwen-omni-utils calls on a uint8 ``(T, C, H, W)`` tensor): the input
#   when the size is unchanged, else cast to float32, ``interpolate(bicubic, align_corners=False, antialias=True)``,
#   clamp to [0, 255] (bicubic into uint8), round, cast back;
# - ``io.read_video(path, start_pts, end_pts, pts_unit="sec", output_format="TCHW")``: torchvision decodes with PyAV
#   and converts each frame with ``frame.to_rgb().to_ndarray()``; so does this one (every frame of the first video
#   stream, its ``average_rate`` as ``video_fps``). :data:`MEMORY_VIDEOS` lets a test hand a frame tensor under a
#   made-up path instead of a file.
#
# Everything else -- qwen-omni-utils' ``process_mm_info`` / ``fetch_image`` / ``fetch_video`` / ``smart_nframes`` /
# ``smart_resize``, ``Qwen2VLVideoProcessor`` (its ``smart_resize``, rescale/normalize fusion, temporal padding and
# patch order), ``Qwen2VLImageProcessorPil``, ``WhisperFeatureExtractor`` and the ``Qwen2_5OmniProcessor`` /
# ``Qwen3OmniMoeProcessor`` calls (placeholder expansion, audio-in-video interleaving, ``video_second_per_grid``) --
# is the published code, unmodified.

#: Made-up paths → (uint8 frames (T, C, H, W), fps) that the stand-in ``read_video`` returns instead of decoding.
MEMORY_VIDEOS: dict[str, tuple[torch.Tensor, float]] = {}


class InterpolationMode(enum.Enum):
    """torchvision.transforms.InterpolationMode (values are the interpolate() mode names)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _v2_resize(image: torch.Tensor, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    """torchvision.transforms.v2.functional.resize_image (explicit [h, w] sizes only)."""
    if isinstance(interpolation, int) or max_size is not None or len(size) != 2:
        raise NotImplementedError("the stand-in resize takes an InterpolationMode and an explicit [height, width]")
    antialias = bool(antialias) and interpolation in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
    align = False if interpolation in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC) else None
    shape = image.shape
    channels, old_h, old_w = shape[-3:]
    new_h, new_w = int(size[0]), int(size[1])
    if (new_h, new_w) == (old_h, old_w):
        return image
    acceptable = [torch.float32, torch.float64]
    if interpolation in (InterpolationMode.NEAREST, InterpolationMode.NEAREST_EXACT) or (
            image.device.type == "cpu" and interpolation == InterpolationMode.BICUBIC):
        acceptable.append(torch.uint8)  # _do_native_uint8_resize_on_cpu(BICUBIC) is True
    dtype = image.dtype
    x = image.reshape(-1, channels, old_h, old_w)
    cast = dtype not in acceptable
    if cast:
        x = x.to(torch.float32)
    x = F.interpolate(x, size=[new_h, new_w], mode=interpolation.value, align_corners=align, antialias=antialias)
    if cast:
        if interpolation == InterpolationMode.BICUBIC and dtype == torch.uint8:
            x = x.clamp_(min=0, max=255)
        if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            x = x.round_()
        x = x.to(dtype=dtype)
    return x.reshape(shape[:-3] + (channels, new_h, new_w))


def _v2_normalize(image: torch.Tensor, mean, std, inplace: bool = False) -> torch.Tensor:
    """torchvision.transforms.v2.functional.normalize_image."""
    if not image.is_floating_point():
        raise TypeError(f"Input tensor should be a float tensor. Got {image.dtype}.")
    mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device)
    std = torch.as_tensor(std, dtype=image.dtype, device=image.device)
    if mean.ndim == 1:
        mean = mean.view(-1, 1, 1)
    if std.ndim == 1:
        std = std.view(-1, 1, 1)
    image = image.sub_(mean) if inplace else image.sub(mean)
    return image.div_(std)


def _v2_grayscale_to_rgb(image: torch.Tensor) -> torch.Tensor:
    """torchvision.transforms.v2.functional.grayscale_to_rgb_image."""
    if image.shape[-3] >= 3:
        return image
    return image.repeat_interleave(3, dim=-3) if image.shape[-3] == 1 else image


def _v1_resize(img: torch.Tensor, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    """torchvision.transforms.functional.resize on a tensor (→ _functional_tensor.resize), explicit [h, w]."""
    if max_size is not None or len(size) != 2:
        raise NotImplementedError("the stand-in resize takes an explicit [height, width]")
    old_h, old_w = img.shape[-2:]
    if [old_h, old_w] == [int(size[0]), int(size[1])]:
        return img
    mode = interpolation.value
    antialias = bool(antialias) and mode in ("bilinear", "bicubic")
    squeeze = img.ndim < 4
    x = img.unsqueeze(0) if squeeze else img
    out_dtype = x.dtype
    cast = out_dtype not in (torch.float32, torch.float64)
    if cast:
        x = x.to(torch.float32)
    align = False if mode in ("bilinear", "bicubic") else None
    x = F.interpolate(x, size=[int(size[0]), int(size[1])], mode=mode, align_corners=align, antialias=antialias)
    if mode == "bicubic" and out_dtype == torch.uint8:
        x = x.clamp(min=0, max=255)
    if squeeze:
        x = x.squeeze(0)
    if cast:
        if out_dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            x = torch.round(x)
        x = x.to(out_dtype)
    return x


def _read_video(filename: str, start_pts=0, end_pts=None, pts_unit: str = "pts", output_format: str = "THWC"):
    """torchvision.io.read_video for what qwen-omni-utils asks (whole stream, seconds, TCHW)."""
    if filename in MEMORY_VIDEOS:
        frames, fps = MEMORY_VIDEOS[filename]
        return frames, torch.zeros(1, 0), {"video_fps": fps}
    if (start_pts or 0) != 0 or end_pts is not None or output_format != "TCHW":
        raise NotImplementedError("the stand-in read_video reads whole streams as TCHW")
    with av.open(filename) as container:
        stream = container.streams.video[0]
        frames = [frame.to_rgb().to_ndarray() for frame in container.decode(stream)]
        fps = float(stream.average_rate or Fraction(0))
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()
    return video, torch.zeros(1, 0), {"video_fps": fps}


def _stand_in() -> dict[str, types.ModuleType]:
    tv = types.ModuleType("torchvision")
    tv.__version__ = "0.24.0"
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    v2 = types.ModuleType("torchvision.transforms.v2")
    v2_functional = types.ModuleType("torchvision.transforms.v2.functional")
    io = types.ModuleType("torchvision.io")
    functional.resize = _v1_resize
    functional.InterpolationMode = InterpolationMode
    v2_functional.resize = _v2_resize
    v2_functional.normalize = _v2_normalize
    v2_functional.grayscale_to_rgb = _v2_grayscale_to_rgb
    v2_functional.InterpolationMode = InterpolationMode
    io.read_video = _read_video
    transforms.functional, transforms.v2, transforms.InterpolationMode = functional, v2, InterpolationMode
    v2.functional = v2_functional
    tv.transforms, tv.io = transforms, io
    return {"torchvision": tv, "torchvision.transforms": transforms, "torchvision.transforms.functional": functional,
            "torchvision.transforms.v2": v2, "torchvision.transforms.v2.functional": v2_functional,
            "torchvision.io": io}


_IMPORTED: dict[str, types.ModuleType] = {}


def _import_with_stand_in(names: tuple[str, ...]) -> dict[str, types.ModuleType]:
    """Import ``names`` afresh with the stand-in torchvision in sys.modules (also where a real torchvision exists:
    the tests read frames from memory through it); afterwards sys.modules is as it was, so neither the stand-in
    nor these copies are seen by anything else (transformers' lazy loader keeps its torchvision-less objects)."""
    missing = [n for n in names if n not in _IMPORTED]
    if missing:
        ours = ("torchvision", "transformers.models.qwen2_vl.video_processing", "qwen_omni_utils")
        saved = {k: v for k, v in sys.modules.items() if k.startswith(ours)}
        for key in saved:
            del sys.modules[key]
        sys.modules.update(_stand_in())
        try:
            for name in missing:
                _IMPORTED[name] = importlib.import_module(name)
        finally:
            for key in [k for k in sys.modules if k.startswith(ours)]:
                del sys.modules[key]
            sys.modules.update(saved)
    return {name: _IMPORTED[name] for name in names}


@contextlib.contextmanager
def official_modules() -> Iterator[types.SimpleNamespace]:
    """``video`` (transformers' video_processing_qwen2_vl) and ``qwen`` (qwen_omni_utils.v2_5, its
    ``process_mm_info`` and ``vision_process``), usable while the context is held."""
    import transformers
    import transformers.image_processing_backends as backends
    import transformers.video_processing_utils as video_utils
    from transformers.image_utils import PILImageResampling

    mods = _import_with_stand_in(("transformers.models.qwen2_vl.video_processing_qwen2_vl",
                                  "transformers.models.qwen2_vl.image_processing_qwen2_vl",
                                  "qwen_omni_utils", "qwen_omni_utils.v2_5.vision_process"))
    tvf = _stand_in()["torchvision.transforms.v2.functional"]
    mapping = {PILImageResampling.NEAREST: InterpolationMode.NEAREST_EXACT,  # image_utils' mapping
               PILImageResampling.BOX: InterpolationMode.BOX, PILImageResampling.BILINEAR: InterpolationMode.BILINEAR,
               PILImageResampling.HAMMING: InterpolationMode.HAMMING, PILImageResampling.BICUBIC: InterpolationMode.BICUBIC,
               PILImageResampling.LANCZOS: InterpolationMode.LANCZOS}
    # the processors check their video processor against transformers.VideoProcessorMixin, which the package
    # does not export without torchvision
    patched = [(video_utils, "tvF"), (backends, "tvF"), (backends, "pil_torch_interpolation_mapping"),
               (transformers, "VideoProcessorMixin")]
    saved = [(m, k, m.__dict__.get(k), k in m.__dict__) for m, k in patched]
    transformers.VideoProcessorMixin = video_utils.VideoProcessorMixin
    video_utils.tvF = tvf
    backends.tvF = tvf
    if not backends.pil_torch_interpolation_mapping:
        backends.pil_torch_interpolation_mapping = mapping
    try:
        yield types.SimpleNamespace(video=mods["transformers.models.qwen2_vl.video_processing_qwen2_vl"],
                                    image=mods["transformers.models.qwen2_vl.image_processing_qwen2_vl"],
                                    qwen=mods["qwen_omni_utils"],
                                    vision=mods["qwen_omni_utils.v2_5.vision_process"])
    finally:
        for module, key, value, had in saved:
            if had:
                setattr(module, key, value)
            else:
                delattr(module, key)


# ============================================================================================== the two families


@dataclass
class Family:
    """One published model's processors: ours (as its checkpoint configures it) and the official one."""

    name: str
    ours: OmniProcessor
    official: Any  # Qwen2_5OmniProcessor | Qwen3OmniMoeProcessor
    thinker: Any  # the thinker at the published config, on the meta device (get_rope_index reads config only)
    patch: int  # vision patch; qwen-omni-utils' image_patch_size


#: Published model → (official processor class, thinker config class, thinker class, our audio rule).
FAMILIES = {
    "qwen2.5-omni-3b": ("Qwen2_5OmniProcessor", "Qwen2_5OmniThinkerConfig",
                        "Qwen2_5OmniThinkerForConditionalGeneration", "qwen2_5_omni"),
    "qwen3-omni-30b-a3b": ("Qwen3OmniMoeProcessor", "Qwen3OmniMoeThinkerConfig",
                           "Qwen3OmniMoeThinkerForConditionalGeneration", "qwen3_omni"),
}
IMAGE_KEYS = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")
AUDIO_KEYS = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "dither")


@pytest.fixture(scope="module")
def official():
    with official_modules() as modules:
        yield modules


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, official, published_tokenizer) -> Family:
    import transformers

    name = request.param
    processor_cls, config_cls, thinker_cls, audio_rule = (getattr(transformers, n) if i < 3 else n
                                                          for i, n in enumerate(FAMILIES[name]))
    model = PUBLISHED[name]
    pre = model.preprocessor
    tokenizer = published_tokenizer(name)
    # the video limits every call of the official processor passes to its video processor (its class attribute
    # videos_kwargs["size"]: 128 to 768 tokens of (2 * patch)^2 pixels), whatever the video processor's own config
    video_size = processor_cls.videos_kwargs["size"]
    official_processor = processor_cls(
        image_processor=Qwen2VLImageProcessorPil(**{k: pre[k] for k in IMAGE_KEYS}),
        video_processor=official.video.Qwen2VLVideoProcessor(
            patch_size=pre["patch_size"], temporal_patch_size=pre["temporal_patch_size"], merge_size=pre["merge_size"],
            image_mean=pre["image_mean"], image_std=pre["image_std"], min_pixels=video_size["shortest_edge"],
            max_pixels=video_size["longest_edge"]),
        feature_extractor=WhisperFeatureExtractor(**{k: pre[k] for k in AUDIO_KEYS}),
        tokenizer=tokenizer, chat_template=model.chat_template)
    ours = OmniProcessor(
        tokenizer, patch_size=pre["patch_size"], temporal_patch_size=pre["temporal_patch_size"],
        merge_size=pre["merge_size"], min_pixels=pre["min_pixels"], max_pixels=pre["max_pixels"],
        video_min_pixels=video_size["shortest_edge"], video_max_pixels=video_size["longest_edge"],
        image_mean=pre["image_mean"], image_std=pre["image_std"],
        feature_extractor=WhisperFeatureExtractor(**{k: pre[k] for k in AUDIO_KEYS}),
        chat_template=model.chat_template, audio_token_rule=audio_rule)
    with torch.device("meta"):
        thinker = thinker_cls(config_cls(**published_config(name, layers=1)["thinker_config"]))
    return Family(name, ours, official_processor, thinker, pre["patch_size"])


# ============================================================================================== media


@dataclass(frozen=True)
class Media:
    image: Path  # 123 x 77 RGB
    rgba: Path  # 64 x 40 with an alpha ramp (qwen-omni-utils lays it on white)
    tiny: Path  # 40 x 30: below min_pixels, scaled up
    clip: Path  # 3.5 s, 10 fps, 96 x 64 H.264 with a 440 Hz AAC track
    tone: Path  # 1.3 s mono WAV at 16 kHz
    chord: Path  # 0.7 s stereo WAV at 44.1 kHz, with noise (mixed down and resampled to 16 kHz on both sides)


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Media:
    out = tmp_path_factory.mktemp("parity_media")
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:77, 0:123]
    smooth = np.stack([xx * 2, yy * 3, (xx + yy) % 256], -1).astype(np.uint8)
    noisy = np.clip(smooth + rng.integers(0, 40, smooth.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(out / "image.png")
    rgba = rng.integers(0, 256, (40, 64, 4), dtype=np.uint8)
    rgba[..., 3] = np.linspace(0, 255, 64, dtype=np.uint8)[None, :]
    Image.fromarray(rgba, mode="RGBA").save(out / "rgba.png")
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(out / "tiny.png")
    write_moving_square_video(out / "clip.mp4", "right", width=96, height=64, fps=10.0, frames=35, with_audio_hz=440.0)
    t = np.arange(int(1.3 * 16_000)) / 16_000
    sf.write(out / "tone.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 16_000, subtype="FLOAT")
    t = np.arange(int(0.7 * 44_100)) / 44_100
    chord = np.stack([0.2 * np.sin(2 * np.pi * 523 * t), 0.2 * np.sin(2 * np.pi * 659 * t)], -1)
    chord += 0.05 * rng.standard_normal(chord.shape)  # broadband: resamplers differ most near Nyquist
    sf.write(out / "chord.wav", chord.astype(np.float32), 44_100, subtype="FLOAT")
    return Media(*(out / n for n in ("image.png", "rgba.png", "tiny.png", "clip.mp4", "tone.wav", "chord.wav")))


BIG_IMAGES = ImageSampling(max_pixels=None)  # decode leaves the size to the processor, as fetch_image does


def _conversation(spec: list[tuple[str, list]], patch: int) -> tuple[list[Message], list[dict]]:
    """Our messages and the official dicts of one conversation: parts are text or ("image" | "video" | "audio" |
    "video+audio", path)."""
    ours, theirs = [], []
    for role, parts in spec:
        mine, dicts = [], []
        for part in parts:
            if isinstance(part, str):
                mine.append(TextPart(part))
                dicts.append({"type": "text", "text": part})
                continue
            kind, path = part
            if kind == "image":
                mine.append(ImagePart(MediaSource.of(path), BIG_IMAGES))
            elif kind == "audio":
                mine.append(AudioPart(MediaSource.of(path), AudioSampling()))
            else:
                sampling = VideoSampling.qwen_omni(patch_size=patch, audio=kind == "video+audio")
                mine.append(VideoPart(MediaSource.of(path), sampling))
            base = kind.split("+")[0]
            dicts.append({"type": base, base: str(path)})
        ours.append(Message(role, tuple(mine)))
        theirs.append({"role": role, "content": dicts})
    return ours, theirs


def _official_call(fam: Family, official, dicts: list[dict], *, track: np.ndarray | None = None):
    """The official path: qwen-omni-utils' process_mm_info, the processor's chat template, the processor. With
    ``track`` the (first) video's audio goes in with it (use_audio_in_video), its waveform handed over as decoded."""
    audios, images, videos, video_kwargs = official.qwen.process_mm_info(
        dicts, use_audio_in_video=False, return_video_kwargs=True, image_patch_size=fam.patch)
    text = fam.official.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True)
    kwargs: dict[str, Any] = {"return_tensors": "pt"}
    if images:
        kwargs["images"] = images
    if videos:
        kwargs["videos"] = videos
        kwargs["videos_kwargs"] = {"fps": video_kwargs["fps"][0]}  # one video per conversation here
    audios = list(audios or [])
    if track is not None:
        # audio slots in conversation order: the video's track first (the video comes first in these conversations)
        kwargs["use_audio_in_video"] = True
        kwargs["audio_from_video_indices"] = [0] + [None] * len(audios)
        audios = [track] + audios
    if audios:
        kwargs["audio"] = audios
    return fam.official(text=[text], **kwargs)


def _rope(fam: Family, batch: dict[str, Any], use_audio_in_video: bool) -> torch.Tensor:
    mask = batch.get("feature_attention_mask")
    positions, _ = fam.thinker.model.get_rope_index(
        batch["input_ids"], batch.get("image_grid_thw"), batch.get("video_grid_thw"), batch["attention_mask"],
        use_audio_in_video, mask.sum(-1) if mask is not None else None, batch.get("video_second_per_grid"))
    return positions


def _assert_parity(fam: Family, messages: list[Message], theirs: Any, *, use_audio_in_video: bool = False,
                   feature_frames_only: bool = False) -> dict[str, Any]:
    rendered = render(messages, fam.ours, cache=None)
    batch = fam.ours.collate([rendered], padding_side="left")
    assert batch["input_ids"].tolist() == theirs["input_ids"].tolist()
    expected_keys = set(theirs) - {"input_ids", "attention_mask"}
    assert set(rendered.mm) == expected_keys
    for key in sorted(expected_keys):
        mine, official = rendered.mm[key], theirs[key]
        assert mine.dtype == official.dtype, key
        if feature_frames_only and key in ("input_features", "feature_attention_mask"):
            continue  # compared frame by frame by the caller
        assert mine.shape == official.shape, key
        assert torch.equal(mine, official), f"{key}: max |diff| {(mine.double() - official.double()).abs().max()}"
    assert bool(batch.get("use_audio_in_video", False)) == use_audio_in_video
    assert torch.equal(_rope(fam, batch, use_audio_in_video), _rope(fam, theirs, use_audio_in_video))
    return rendered.mm


# ============================================================================================== conversations


def test_images_match_the_official_processor(family, official, media):
    """Three images (one RGBA, one below min_pixels) over two user turns and an assistant turn."""
    messages, dicts = _conversation([
        ("user", [("image", media.image), "What is in these?", ("image", media.rgba)]),
        ("assistant", ["A gradient and some noise."]),
        ("user", ["And this one?", ("image", media.tiny)]),
    ], family.patch)
    theirs = _official_call(family, official, dicts)
    mm = _assert_parity(family, messages, theirs)
    factor = family.patch * 2
    for h, w in (mm["image_grid_thw"][:, 1:] * family.patch).tolist():
        assert h % factor == 0 and w % factor == 0 and h * w >= 3136


def test_images_with_the_torchvision_image_backend(family, official, media):
    """transformers' AutoProcessor picks the torchvision image processor (Qwen2VLImageProcessor) over the PIL one
    whenever torchvision imports, as on a GPU machine. On qwen-omni-utils' images (already at the smart_resize size,
    so its resize returns them as they are) it fuses rescale and normalise, ``(x - 255 mean) / (255 std)``, where
    the PIL backend computes ``x / 255`` in float64, casts, then ``(x - mean) / std``: the same values up to float32
    rounding. Ours follows the PIL backend bit for bit (test above); against this one ids, grids and rope positions
    are identical and pixel_values agree within 1e-6 (|values| <= 2.2, where a float32 ulp is 2.4e-7; each
    formula rounds twice)."""
    pre = PUBLISHED[family.name].preprocessor
    backend = type(family.official)(
        image_processor=official.image.Qwen2VLImageProcessor(**{k: pre[k] for k in IMAGE_KEYS}),
        video_processor=family.official.video_processor, feature_extractor=family.official.feature_extractor,
        tokenizer=family.official.tokenizer, chat_template=family.official.chat_template)
    messages, dicts = _conversation([("user", [("image", media.image), ("image", media.rgba), ("image", media.tiny),
                                               "Describe them."])], family.patch)
    theirs = _official_call(Family(family.name, family.ours, backend, family.thinker, family.patch), official, dicts)
    rendered = render(messages, family.ours, cache=None)
    batch = family.ours.collate([rendered], padding_side="left")
    assert batch["input_ids"].tolist() == theirs["input_ids"].tolist()
    assert torch.equal(rendered.mm["image_grid_thw"], theirs["image_grid_thw"])
    diff = (rendered.mm["pixel_values"] - theirs["pixel_values"]).abs().max().item()
    assert diff <= 1e-6
    assert torch.equal(_rope(family, batch, False), _rope(family, theirs, False))


def test_video_matches_the_official_processor(family, official, media):
    """A 3.5 s, 10 fps clip: qwen-omni-utils picks 6 of its 35 frames (sample_fps 6 / 35 * 10) and scales them
    up to its per-frame minimum (128 tokens); the official processor is handed that fps, as
    ``process_mm_info(return_video_kwargs=True)`` returns it."""
    messages, dicts = _conversation([("user", [("video", media.clip), "What moves?"])], family.patch)
    theirs = _official_call(family, official, dicts)
    mm = _assert_parity(family, messages, theirs)
    assert mm["video_grid_thw"][0, 0].item() == 3  # 6 frames / temporal patch 2
    assert mm["video_second_per_grid"].item() == pytest.approx(2 / (6 / 35 * 10))


def test_audio_matches_the_official_processor(family, official, media):
    """Two WAV clips (one 44.1 kHz stereo: mixed down and resampled, by librosa.load on the official side) and an
    image, over two user turns. Qwen2.5-Omni pads both clips to
    the extractor's 300 s chunk, so features are compared whole. Qwen3-Omni keeps each clip's length, and its
    processor pads every waveform of one call to the longest before computing features: the shorter clip's last
    frames then see zeros where, alone, they see the clip's reflection (STFT centring), and the padded frames
    hold the log-mel of silence. Our processor encodes each clip alone (as one clip per call gives) and pads the
    features with zeros, which the mask marks as padding. So for Qwen3-Omni: the longest clip identical, the
    shorter one identical except its last ``n_fft / 2 / hop`` (2) frames, masks identical over the valid frames."""
    messages, dicts = _conversation([
        ("user", [("audio", media.tone), "What is this note?", ("image", media.tiny)]),
        ("assistant", ["An E."]),
        ("user", [("audio", media.chord), "And these?"]),
    ], family.patch)
    theirs = _official_call(family, official, dicts)
    qwen3 = family.name.startswith("qwen3")
    mm = _assert_parity(family, messages, theirs, feature_frames_only=qwen3)
    if not qwen3:
        assert mm["input_features"].shape == (2, 128, 30_000)  # 300 s chunks (published chunk_length)
        return
    mine_mask, their_mask = mm["feature_attention_mask"], theirs["feature_attention_mask"]
    assert torch.equal(mine_mask.sum(-1), their_mask.sum(-1))
    lengths = their_mask.sum(-1).tolist()
    assert lengths == [130, 70]
    edge = family.ours.feature_extractor.n_fft // 2 // family.ours.feature_extractor.hop_length
    for i, n in enumerate(lengths):
        keep = n if n == max(lengths) else n - edge
        assert torch.equal(mm["input_features"][i, :, :keep], theirs["input_features"][i, :, :keep])
        assert torch.equal(mine_mask[i, :n], their_mask[i, :n])


def test_audio_in_video_matches_the_official_processor(family, official, media):
    """use_audio_in_video: the clip's AAC track goes in with its frames (Qwen2.5-Omni: 2 s chunks of 25 positions
    per second, each chunk's video tokens then its audio tokens; Qwen3-Omni: merged token by token at 13 per
    second), followed by a separate WAV clip. The official processor is handed the track as our decoder decoded
    it (its ``audio_from_video_indices`` path for callers that decoded the track themselves): qwen-omni-utils
    would decode it with ``audioread`` through the ``ffmpeg`` program, which this machine does not have."""
    messages, dicts = _conversation(
        [("user", [("video+audio", media.clip), ("audio", media.chord), "What do you hear?"])], family.patch)
    ours = family.ours.with_chat_template(family.ours.chat_template)
    ours.use_audio_in_video = True
    fam = Family(family.name, ours, family.official, family.thinker, family.patch)
    track = messages[0].content[0].decode(None).audio
    assert track is not None and track.duration_s == pytest.approx(3.5, abs=0.05)
    theirs = _official_call(fam, official, dicts, track=np.asarray(track.waveform))
    qwen3 = family.name.startswith("qwen3")
    mm = _assert_parity(fam, messages, theirs, use_audio_in_video=True, feature_frames_only=qwen3)
    ids = theirs["input_ids"][0].tolist()
    bos = ids.index(ours.vision_bos_token_id)
    assert ids[bos + 1] == ours.audio_bos_token_id
    inside = ids[bos + 2:ids.index(ours.audio_eos_token_id, bos)]
    # the video and audio tokens alternate in more than one run (more than one chunk / interleaving)
    runs = sum(1 for a, b in zip(inside, inside[1:]) if a != b) + 1
    assert set(inside) == {ours.video_token_id, ours.audio_token_id} and runs >= 3
    if qwen3:  # as in test_audio_matches_the_official_processor: the track is the longest clip, the WAV shorter
        n = theirs["feature_attention_mask"].sum(-1).tolist()
        edge = ours.feature_extractor.n_fft // 2 // ours.feature_extractor.hop_length
        assert torch.equal(mm["feature_attention_mask"].sum(-1), theirs["feature_attention_mask"].sum(-1))
        assert n[0] > n[1]
        assert torch.equal(mm["input_features"][0, :, :n[0]], theirs["input_features"][0, :, :n[0]])
        assert torch.equal(mm["input_features"][1, :, :n[1] - edge], theirs["input_features"][1, :, :n[1] - edge])


# ============================================================================================== pieces


@pytest.mark.parametrize("total, video_fps, fps, min_frames, max_frames, start, end", [
    (35, 10.0, 2.0, 4, 768, None, None),  # 7 -> 6
    (300, 30.0, 2.0, 4, 768, None, None),  # 20
    (182, 25.0, 2.0, 4, 768, None, None),  # 14.56 -> 14
    (9, 30.0, 2.0, 4, 768, None, None),  # 0.6 -> min 4
    (5, 30.0, 2.0, 4, 768, None, None),  # min 4 of 5 frames
    (3, 30.0, 2.0, 4, 768, None, None),  # fewer frames than the minimum: 2
    (100_000, 29.97, 2.0, 4, 768, None, None),  # capped at 768
    (900, 30.0, 0.5, 4, 7, None, None),  # odd caps round to even: 6
    (900, 30.0, 1.0, 5, 100, None, None),  # odd minimum rounds up: 30
    (900, 30.0, 2.0, 4, 768, 3.3, None),  # span from 3.3 s
    (900, 30.0, 2.0, 4, 768, 2.0, 12.5),  # span 2..12.5 s
    (250, 24.0, 3.0, 4, 768, None, 5.01),
])
def test_frame_choice_is_smart_nframes_and_linspace(official, total, video_fps, fps, min_frames, max_frames, start,
                                                    end):
    """Which frames: qwen-omni-utils' calculate_video_frame_range, smart_nframes and the index rule of its
    torchcodec / decord readers (``torch.linspace(first, last, n).round()``), and the sample fps it reports."""
    vp = official.vision
    rule = QwenVideoRule()
    ele = {"fps": fps, "min_frames": min_frames, "max_frames": max_frames}
    if start is not None:
        ele["video_start"] = start
    if end is not None:
        ele["video_end"] = end
    first, last, count = vp.calculate_video_frame_range(ele, total, video_fps)
    n = vp.smart_nframes(ele, total_frames=count, video_fps=video_fps)
    expected = torch.linspace(first, last, n).round().long().tolist()
    idx, sample_fps = rule.frame_indices(total, video_fps, fps, min_frames, max_frames, start, end)
    assert idx == expected
    assert sample_fps == n / max(count, 1e-6) * video_fps


@pytest.mark.parametrize("frames, height, width, video_fps, patch, ele", [
    (35, 64, 96, 10.0, 14, {}),  # scaled up to the 128-token floor
    (8, 480, 854, 4.0, 14, {}),  # scaled down to the 768-token cap
    (12, 720, 1280, 6.0, 16, {}),  # Qwen3-Omni's 32-pixel factor
    (8, 300, 500, 4.0, 14, {"total_pixels": 1_600_000}),  # the whole-video budget bites: 400,000 px per frame
    (8, 300, 500, 4.0, 14, {"min_pixels": 50_176, "max_pixels": 150_000}),
    (9, 61, 203, 9.0, 14, {"fps": 1.0}),  # odd sizes, 2 of 9 frames
])
def test_fetch_video_frames_equal_ours(official, frames, height, width, video_fps, patch, ele):
    """qwen-omni-utils' fetch_video run for real (its torchvision reader fed the frames from memory, see
    ``MEMORY_VIDEOS``) against our video_from_array with the qwen rule: same frames picked, same size, same
    resized pixels, same sample fps."""
    rng = np.random.default_rng(frames)
    video = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    key = f"memory://{frames}x{height}x{width}"
    MEMORY_VIDEOS[key] = (torch.from_numpy(video).permute(0, 3, 1, 2).contiguous(), video_fps)
    try:
        theirs, their_fps = official.vision.fetch_video({"video": key, "fps": ele.get("fps", 2.0), **ele},
                                                        image_patch_size=patch, return_video_sample_fps=True)
    finally:
        del MEMORY_VIDEOS[key]
    rule = QwenVideoRule(patch_size=patch, **{k: v for k, v in ele.items() if k != "fps"})
    spec = VideoSampling.qwen_omni(patch_size=patch, fps=ele.get("fps", 2.0)).model_copy(update={"qwen": rule})
    ours = video_from_array(video, video_fps, spec)
    assert ours.frames.shape == tuple(theirs.permute(0, 2, 3, 1).shape)
    assert torch.equal(torch.from_numpy(np.asarray(ours.frames)).permute(0, 3, 1, 2).float(), theirs)
    assert ours.sample_fps == their_fps


@pytest.mark.parametrize("size, target", [((61, 203), (56, 196)), ((64, 96), (280, 392)), ((480, 854), (476, 840))])
def test_frame_resize_is_torchvision_bicubic_antialias(size, target):
    """resize_frames is torchvision's tensor resize (the stand-in above transcribes its source) -- not PIL's
    bicubic, which differs by up to 9 grey levels on the same frames."""
    frames = np.random.default_rng(1).integers(0, 256, (3, *size, 3), dtype=np.uint8)
    mine = resize_frames(frames, *target)
    tensor = torch.from_numpy(frames).permute(0, 3, 1, 2)
    theirs = _v1_resize(tensor, list(target), InterpolationMode.BICUBIC, antialias=True).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(mine, theirs)
    pil = np.stack([np.asarray(Image.fromarray(f).resize(target[::-1], Image.Resampling.BICUBIC)) for f in frames])
    assert np.abs(pil.astype(int) - mine.astype(int)).max() > 1


@pytest.mark.parametrize("values", [[0, 10, 49, 50, 99, 100, 150], [0, 120, 130], list(range(87)),
                                    [0.0, 29.2, 58.3, 58.3], []])
def test_chunks_are_the_official_get_chunked_index(values):
    """Qwen2.5-Omni's chunk cut (a value reaching the next bound opens a chunk; a jump over two bounds opens one)."""
    expected = [b - a for a, b in Qwen2_5OmniProcessor.get_chunked_index(None, np.asarray(values, dtype=float), 50)]
    assert _chunk_sizes(np.asarray(values, dtype=float), 50) == expected


def test_a_batch_cannot_mix_videos_with_and_without_their_audio(family):
    p = family.ours
    with_audio = [p.vision_bos_token_id, p.audio_bos_token_id, p.video_token_id, p.audio_token_id, p.audio_eos_token_id,
                  p.vision_eos_token_id]
    plain = [p.vision_bos_token_id, p.video_token_id, p.vision_eos_token_id]
    assert p._audio_in_video([with_audio, [1, 2]]) and not p._audio_in_video([plain])
    with pytest.raises(ValueError, match="mixes videos"):
        p._audio_in_video([with_audio, plain])


def test_use_audio_in_video_needs_the_track(family, media):
    p = family.ours.with_chat_template(family.ours.chat_template)
    p.use_audio_in_video = True
    video = VideoPart(MediaSource.of(media.clip), VideoSampling.qwen_omni(patch_size=family.patch)).decode(None)
    with pytest.raises(ValueError, match="without its audio track"):
        p.encode_video(video)


def test_tiny_thinker_runs_audio_in_video(model, processor, media):
    """The thinker's forward takes what collate() gives for audio-in-video (the flag, interleaved tokens, both
    feature sets) and places every feature: a tiny random thinker runs it."""
    p = processor.with_chat_template(processor.chat_template)
    p.use_audio_in_video = True
    part = VideoPart(MediaSource.of(media.clip), VideoSampling(fps=2.0, max_frames=4, max_pixels=64 * 64,
                                                              audio=AudioSampling()))
    rendered = render([Message("user", (part, TextPart("hi")))], p, cache=None)
    batch = p.collate([rendered])
    batch.pop("loss_mask")
    assert bool(batch["use_audio_in_video"])
    with torch.no_grad():
        logits = model(**batch).logits
    assert torch.isfinite(logits).all() and logits.shape[1] == len(rendered.input_ids)


# ============================================================================================== logits at real width

LOGITS_ATOL = 1e-5  # fp32; the same inputs give the same logits, so any gap is an input that differs


def test_logits_at_real_width_equal_the_official_path(official, media, standin_3b):
    """One fp32 forward of the Qwen2.5-Omni-3B stand-in (real widths, loaded through ``model.path`` with its own
    tokenizer, template and preprocessor limits) on a video + image + audio conversation: rendered by us vs by
    qwen-omni-utils + ``Qwen2_5OmniProcessor`` built from the same directory's files. The inputs are identical and
    the logits within ``LOGITS_ATOL`` (measured: 0)."""
    import gc

    import transformers

    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    model, ours = build_policy(PolicyConfig(path=str(standin_3b), dtype="float32"))
    assert model.get_input_embeddings().weight.shape == (151936, 2048)
    pre = json.loads((standin_3b / "preprocessor_config.json").read_text())
    size = transformers.Qwen2_5OmniProcessor.videos_kwargs["size"]
    official_processor = transformers.Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessorPil(**{k: pre[k] for k in IMAGE_KEYS}),
        video_processor=official.video.Qwen2VLVideoProcessor(
            patch_size=pre["patch_size"], temporal_patch_size=pre["temporal_patch_size"], merge_size=pre["merge_size"],
            image_mean=pre["image_mean"], image_std=pre["image_std"], min_pixels=size["shortest_edge"],
            max_pixels=size["longest_edge"]),
        feature_extractor=WhisperFeatureExtractor(**{k: pre[k] for k in AUDIO_KEYS}),
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(standin_3b)),
        chat_template=json.loads((standin_3b / "chat_template.json").read_text())["chat_template"])
    fam = Family("qwen2.5-omni-3b", ours, official_processor, None, pre["patch_size"])
    messages, dicts = _conversation([("user", [("video", media.clip), ("image", media.image), "Which way?",
                                               ("audio", media.tone)])], fam.patch)
    theirs = _official_call(fam, official, dicts)
    rendered = render(messages, ours, cache=None)
    batch = ours.collate([rendered], padding_side="left")
    batch.pop("loss_mask")
    assert batch["input_ids"].tolist() == theirs["input_ids"].tolist()
    for key in rendered.mm:
        assert torch.equal(batch[key], theirs[key]), key
    with torch.no_grad():
        mine = model(**batch).logits
        official_logits = model(**{k: v for k, v in theirs.items()}).logits
    gap = (mine - official_logits).abs().max().item()
    assert mine.shape == (1, len(rendered.input_ids), 151936) and torch.isfinite(mine).all()
    assert gap <= LOGITS_ATOL, gap
    del model, mine, official_logits
    gc.collect()
