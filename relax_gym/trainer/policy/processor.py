"""The Qwen2.5-Omni thinker's multimodal processor, assembled without torchvision.

``transformers``' own ``Qwen2_5OmniProcessor`` needs a torchvision video processor, and PyPI's torchvision does not
load beside our CPU torch. This class does the same work by hand, on the numpy arrays our decoders produce:

- image ``uint8 (H, W, 3)`` → resized with Qwen's ``smart_resize`` (sides a multiple of ``patch_size *
  merge_size``, pixel count within ``[min_pixels, max_pixels]``; bicubic), rescaled, CLIP-normalised and cut into
  ``patch_size`` patches in Qwen2-VL's order: rows of ``pixel_values`` are ``(gh/m, gw/m, m, m)`` and each row is
  ``(C, temporal_patch, ps, ps)`` with the frame repeated over the temporal patch. Identical to
  ``Qwen2VLImageProcessorPil`` (a test checks it).
- video ``uint8 (T, H, W, 3)`` (or a :class:`~relax_gym.omni.DecodedVideo`) → the same per frame, ``T`` padded to a
  multiple of ``temporal_patch_size`` by repeating the last frame, rows in ``(gt, gh/m, gw/m, m, m)`` order with
  ``(C, tp, ps, ps)`` columns; ``video_second_per_grid = temporal_patch_size / fps`` (fps from the frame
  timestamps) places the frames on the time axis of the 3-D rope.
- audio ``float32`` mono 16 kHz (or a :class:`~relax_gym.omni.DecodedAudio`) → ``WhisperFeatureExtractor(
  feature_size=128)`` log-mel features padded to the fixed chunk length (as ``Qwen2_5OmniProcessor`` does:
  ``padding="max_length"``), with their ``feature_attention_mask``; the audio takes
  ``_get_feat_extract_output_lengths(frames)`` placeholder tokens (1 s → 100 frames → 25 tokens).

Each media item becomes a :class:`MediaEncoding`: the ids that replace its placeholder token (``n`` copies of
``<|IMAGE|>`` / ``<|VIDEO|>`` / ``<|AUDIO|>``) and tensors whose first axis concatenates across items, so a
conversation's (or a batch's) media is the per-key ``torch.cat`` of its items in order. The keys are exactly the
thinker's ``forward``/``generate`` arguments: ``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``,
``video_grid_thw``, ``video_second_per_grid``, ``input_features``, ``feature_attention_mask``. (The
Qwen2.5-Omni thinker of transformers 5.24 takes no ``mm_token_type_ids``: it finds media by token id.)

``render`` (``relax_gym.omni.render``) drives this processor through ``apply_chat_template``, ``encode_text``,
``encode_media`` and ``media_token_ids``; ``__call__`` is the usual HF entry point for text with placeholders.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import AutoTokenizer, BatchFeature, PreTrainedTokenizerBase, WhisperFeatureExtractor

from relax_gym.omni.decode import DecodedAudio, DecodedVideo, resize_frames
from relax_gym.omni.render import concat_media
from relax_gym.omni.cache import LRUCache, array_key
from relax_gym.trainer.policy.tokenizer import MEDIA_TOKENS, build_tokenizer

__all__ = ["MEDIA_KEYS", "MediaEncoding", "OmniProcessor", "build_processor", "smart_resize"]

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PREPROCESSOR_CONFIG = "preprocessor_config.json"
VIDEO_PREPROCESSOR_CONFIG = "video_preprocessor_config.json"
#: Per-frame video limits when a checkpoint has no video config: qwen-omni-utils' VIDEO_MIN_PIXELS / VIDEO_MAX_PIXELS
#: and Qwen2VLVideoProcessor's default ``size`` (never the image limits: those allow 16x more pixels per frame).
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
#: transformers' processor class of each audio placeholder rule (the family), and back.
PROCESSOR_CLASSES = {"qwen2_5_omni": "Qwen2_5OmniProcessor", "qwen3_omni": "Qwen3OmniMoeProcessor"}
AUDIO_RULE_OF_CLASS = {v: k for k, v in PROCESSOR_CLASSES.items()}
#: keys older relax-gym versions wrote into preprocessor_config.json (read, never written again)
RELAX_GYM_KEYS = ("video_min_pixels", "video_max_pixels", "default_video_fps", "audio_token_rule")

#: Every tensor a conversation's media can contribute, by kind.
MEDIA_KEYS: dict[str, tuple[str, ...]] = {
    "image": ("pixel_values", "image_grid_thw"),
    "video": ("pixel_values_videos", "video_grid_thw", "video_second_per_grid"),
    "audio": ("input_features", "feature_attention_mask"),
}
MIN_AUDIO_SAMPLES = 1600  # 0.1 s at 16 kHz: shorter clips are zero-padded (they would give no audio token)


@dataclass
class MediaEncoding:
    """One media item: its placeholder expansion and its tensors (first axis concatenates across items)."""

    kind: str
    token_ids: list[int]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule: sides multiples of ``factor``, area in ``[min_pixels, max_pixels]``, aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class OmniProcessor:
    """Tokenizer + image/video patcher + Whisper features for the Qwen2.5-Omni thinker (no torchvision)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        patch_size: int = 14,
        temporal_patch_size: int = 2,
        merge_size: int = 2,
        min_pixels: int = 56 * 56,
        max_pixels: int = 28 * 28 * 1280,
        video_min_pixels: int | None = None,
        video_max_pixels: int | None = None,
        image_mean: Sequence[float] = OPENAI_CLIP_MEAN,
        image_std: Sequence[float] = OPENAI_CLIP_STD,
        feature_extractor: WhisperFeatureExtractor | None = None,
        default_video_fps: float = 2.0,
        chat_template: str | None = None,
        audio_token_rule: str = "qwen2_5_omni",
        use_audio_in_video: bool = False,
    ) -> None:
        if audio_token_rule not in AUDIO_TOKEN_RULES:
            raise ValueError(f"unknown audio_token_rule {audio_token_rule!r}; choose one of {sorted(AUDIO_TOKEN_RULES)}")
        self.audio_token_rule = audio_token_rule  # which audio tower's output length the placeholders follow
        # a video's decoded audio track goes in with it, interleaved in time (the official processors'
        # use_audio_in_video / load_audio_from_video); the thinker's forward then needs use_audio_in_video=True,
        # which collate() adds to a batch holding such videos
        self.use_audio_in_video = bool(use_audio_in_video)
        self.tokenizer = tokenizer
        self.patch_size = int(patch_size)
        self.temporal_patch_size = int(temporal_patch_size)
        self.merge_size = int(merge_size)
        self.min_pixels = int(min_pixels)
        self.max_pixels = int(max_pixels)
        self.video_min_pixels = int(video_min_pixels if video_min_pixels is not None else min_pixels)
        self.video_max_pixels = int(video_max_pixels if video_max_pixels is not None else max_pixels)
        self.image_mean = np.asarray(image_mean, dtype=np.float32)
        self.image_std = np.asarray(image_std, dtype=np.float32)
        self.feature_extractor = feature_extractor or WhisperFeatureExtractor(feature_size=128)
        self.default_video_fps = float(default_video_fps)
        self.chat_template = chat_template if chat_template is not None else tokenizer.chat_template
        # Token names as the Qwen2.5-Omni tokenizer exposes them, falling back to its standard spellings.
        for attr, default in MEDIA_TOKENS.items():
            token = getattr(tokenizer, attr, None) or default
            setattr(self, attr, str(token))
            token_id = tokenizer.convert_tokens_to_ids(str(token))
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise ValueError(f"the tokenizer has no {attr} {token!r} as a single token")
            setattr(self, f"{attr}_id", int(token_id))
        self.eos_token = str(tokenizer.eos_token)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.pad_token_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        # the group's samples and the template's fixed pieces are encoded again and again: keep recent results
        self.text_cache = LRUCache(4096)
        self.media_cache = LRUCache(256, max_bytes=MEDIA_CACHE_BYTES, weigh=_encoding_bytes)

    def with_chat_template(self, chat_template: str) -> OmniProcessor:
        """A shallow copy that renders with another chat template (same tokenizer and media settings)."""
        other = copy.copy(self)
        other.chat_template = chat_template
        return other

    # -- text ---------------------------------------------------------------------------------------------

    @property
    def media_token_ids(self) -> dict[str, int]:
        """The placeholder id of each media kind, as the chat template emits it (one per item, before expansion)."""
        return {"image": self.image_token_id, "video": self.video_token_id, "audio": self.audio_token_id}

    @property
    def control_token_ids(self) -> list[int]:
        """Ids a policy must never sample: media placeholders and their brackets, ``<|vision_pad|>``, the pad
        token and ``<|im_start|>`` (a sampled media token breaks the next forward: features and tokens mismatch)."""
        ids = {self.image_token_id, self.video_token_id, self.audio_token_id, self.vision_bos_token_id,
               self.vision_eos_token_id, self.audio_bos_token_id, self.audio_eos_token_id, self.pad_token_id}
        for name in ("<|vision_pad|>", "<|im_start|>"):
            token_id = self.tokenizer.convert_tokens_to_ids(name)
            if token_id is not None and token_id != self.tokenizer.unk_token_id:
                ids.add(int(token_id))
        ids.discard(self.eos_token_id)
        return sorted(ids)

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]], *, tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str | list[int]:
        """The chat template on OpenAI-style dicts (content a string or a list of ``{"type": ...}`` parts);
        media parts become single placeholders, expanded only by ``render`` / ``__call__``."""
        return self.tokenizer.apply_chat_template(
            list(conversation), chat_template=self.chat_template, tokenize=tokenize,
            add_generation_prompt=add_generation_prompt, **kwargs,
        )

    def encode_text(self, text: str) -> list[int]:
        ids = self.text_cache.get(text, lambda: tuple(self.tokenizer.encode(text, add_special_tokens=False)))
        return list(ids)

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str:
        return self.tokenizer.decode(list(token_ids), **kwargs)

    def batch_decode(self, sequences, **kwargs: Any) -> list[str]:
        return self.tokenizer.batch_decode(sequences, **kwargs)

    # -- media --------------------------------------------------------------------------------------------

    def encode_media(self, kind: str, data: Any) -> MediaEncoding:
        if kind == "image":
            return self.encode_image(data)
        if kind == "video":
            return self.encode_video(data)
        if kind == "audio":
            return self.encode_audio(data)
        raise ValueError(f"unknown media kind {kind!r}")

    def encode_image(self, image: np.ndarray | Image.Image) -> MediaEncoding:
        array = np.asarray(image.convert("RGB")) if isinstance(image, Image.Image) else np.asarray(image)
        if array.ndim != 3 or array.shape[-1] != 3 or array.dtype != np.uint8:
            raise ValueError(f"an image must be uint8 (H, W, 3), got {array.dtype} {array.shape}")
        return self.media_cache.get(array_key(array, "image", self._media_settings()), lambda: self._encode_image(array))

    def _encode_image(self, array: np.ndarray) -> MediaEncoding:
        frames = self._resize_normalise_image(array)[None]
        frames = np.repeat(frames, self.temporal_patch_size, axis=0)  # an image is a still clip of tp frames
        patches, grid = self._patchify(frames)
        n = int(np.prod(grid)) // self.merge_size**2
        return MediaEncoding("image", [self.image_token_id] * n, {
            "pixel_values": torch.from_numpy(patches),
            "image_grid_thw": torch.tensor([grid], dtype=torch.long),
        })

    def encode_video(self, video: DecodedVideo | np.ndarray, *, fps: float | None = None) -> MediaEncoding:
        """Frames → ``<|VIDEO|>`` tokens and the video tensors. ``fps`` (what ``video_second_per_grid =
        temporal_patch_size / fps`` places on the rope's time axis) is, in order: the argument, the rate
        qwen-omni-utils reports for frames picked by its rule (``DecodedVideo.sample_fps``: what its
        ``process_mm_info(return_video_kwargs=True)`` hands the official processor), the rate of the timestamps,
        ``default_video_fps``. With :attr:`use_audio_in_video` the video's decoded audio track is interleaved
        with its frames (:meth:`_interleave`): the encoding then also holds the audio tensors."""
        audio = None
        if isinstance(video, DecodedVideo):
            frames = np.asarray(video.frames)
            fps = fps or video.sample_fps or _fps_of(video.timestamps)
            audio = video.audio
        else:
            frames = np.asarray(video)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or frames.shape[0] == 0:
            raise ValueError(f"a video must be uint8 (T, H, W, 3) with T >= 1, got {frames.dtype} {frames.shape}")
        fps = float(fps or self.default_video_fps)
        key = array_key(frames, "video", fps, self._media_settings())
        encoding = self.media_cache.get(key, lambda: self._encode_video(frames, fps))
        if not self.use_audio_in_video:
            return encoding
        if audio is None:
            raise ValueError("use_audio_in_video is set but the video comes without its audio track: decode it with "
                             "VideoSampling(audio=AudioSampling()) (VideoSampling.qwen_omni(audio=True))")
        sound = self.encode_audio(audio)
        return MediaEncoding("video", self._interleave(encoding, sound.num_tokens, self.temporal_patch_size / fps),
                             {**encoding.tensors, **sound.tensors})

    def _encode_video(self, frames: np.ndarray, fps: float) -> MediaEncoding:
        patches, grid = self._patchify(self._resize_normalise_video(frames))
        n = int(np.prod(grid)) // self.merge_size**2
        return MediaEncoding("video", [self.video_token_id] * n, {
            "pixel_values_videos": torch.from_numpy(patches),
            "video_grid_thw": torch.tensor([grid], dtype=torch.long),
            "video_second_per_grid": torch.tensor([self.temporal_patch_size / fps], dtype=torch.float32),
        })

    def _interleave(self, video: MediaEncoding, audio_tokens: int, second_per_grid: float) -> list[int]:
        """The ids that replace a video's placeholder when its audio goes in with it, as the official processors'
        ``replace_video_with_audio_token`` writes them: ``<|audio_bos|>``, then video and audio tokens by time,
        then ``<|audio_eos|>`` (the chat template's ``<|vision_bos|>`` / ``<|vision_eos|>`` stay around them).
        Each video token's time is its temporal grid index x ``second_per_grid`` x ``position_id_per_seconds``,
        each audio token's its index (one position per audio token).

        - Qwen2.5-Omni: both cut into chunks of ``position_id_per_seconds * seconds_per_chunk`` positions (25 x 2
          s); per chunk the video tokens, then the audio tokens.
        - Qwen3-Omni: merged token by token, a video token first while its time is <= the next audio token's
          (13 positions per second)."""
        gt, gh, gw = (int(v) for v in video.tensors["video_grid_thw"][0])
        per_grid = (gh // self.merge_size) * (gw // self.merge_size)
        per_second, per_chunk_s = AUDIO_IN_VIDEO[self.audio_token_rule]
        video_times = np.repeat(np.arange(gt), per_grid) * second_per_grid * per_second
        audio_times = np.arange(audio_tokens)
        v, a = self.video_token_id, self.audio_token_id
        ids = [self.audio_bos_token_id]
        if self.audio_token_rule == "qwen3_omni":
            i = j = 0
            while i < len(video_times) and j < len(audio_times):
                if video_times[i] <= audio_times[j]:
                    ids.append(v)
                    i += 1
                else:
                    ids.append(a)
                    j += 1
            ids += [v] * (len(video_times) - i) + [a] * (len(audio_times) - j)
        else:
            per_chunk = int(per_second * per_chunk_s)
            video_chunks, audio_chunks = _chunk_sizes(video_times, per_chunk), _chunk_sizes(audio_times, per_chunk)
            for k in range(max(len(video_chunks), len(audio_chunks))):
                ids += [v] * (video_chunks[k] if k < len(video_chunks) else 0)
                ids += [a] * (audio_chunks[k] if k < len(audio_chunks) else 0)
        ids.append(self.audio_eos_token_id)
        return ids

    def encode_audio(self, audio: DecodedAudio | np.ndarray, *, sample_rate: int | None = None) -> MediaEncoding:
        fe = self.feature_extractor
        if isinstance(audio, DecodedAudio):
            wave, sample_rate = np.asarray(audio.waveform), audio.sample_rate
        else:
            wave = np.asarray(audio)
        sample_rate = int(sample_rate or fe.sampling_rate)
        if sample_rate != fe.sampling_rate:
            raise ValueError(f"audio must be sampled at {fe.sampling_rate} Hz for the feature extractor, got {sample_rate} "
                             "(decode it with AudioSampling(sample_rate=...))")
        if wave.ndim != 1 or not np.issubdtype(wave.dtype, np.floating):
            raise ValueError(f"audio must be a mono float waveform (N,), got {wave.dtype} {wave.shape}")
        key = array_key(wave, "audio", sample_rate, self.audio_token_rule, fe.feature_size, fe.n_samples)
        return self.media_cache.get(key, lambda: self._encode_audio(wave, sample_rate))

    def _encode_audio(self, wave: np.ndarray, sample_rate: int) -> MediaEncoding:
        """Whisper features as the family's official processor asks for them: Qwen2.5-Omni pads every clip to the
        extractor's chunk (``padding="max_length"``, longer clips cut), Qwen3-Omni keeps each clip's own length
        (``padding=True, truncation=False``)."""
        fe = self.feature_extractor
        if len(wave) < MIN_AUDIO_SAMPLES:
            wave = np.pad(wave, (0, MIN_AUDIO_SAMPLES - len(wave)))
        padding, truncation = AUDIO_PADDING[self.audio_token_rule]
        out = fe(wave.astype(np.float32), sampling_rate=sample_rate, padding=padding, truncation=truncation,
                 return_attention_mask=True, return_tensors="pt")
        mask = out["attention_mask"]  # int32, as the official processors hand it over
        frames = int(mask.sum())
        n = AUDIO_TOKEN_RULES[self.audio_token_rule](frames)
        return MediaEncoding("audio", [self.audio_token_id] * n, {
            "input_features": out["input_features"].to(torch.float32),
            "feature_attention_mask": mask,
        })

    def _media_settings(self) -> tuple:
        """What an image / video encoding depends on besides the pixels (part of its cache key)."""
        return (self.patch_size, self.temporal_patch_size, self.merge_size, self.min_pixels, self.max_pixels,
                self.video_min_pixels, self.video_max_pixels, self.image_mean.tobytes(), self.image_std.tobytes())

    def _resize_normalise_image(self, image: np.ndarray) -> np.ndarray:
        """uint8 (H, W, 3) → float32 (3, h, w) as ``Qwen2VLImageProcessorPil`` makes it: ``smart_resize`` with
        PIL's bicubic, then rescaled in float64 and cast (``image_transforms.rescale``), then ``(x - mean) / std``
        in float32 (``normalize``)."""
        height, width, _ = image.shape
        h, w = smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)
        if (h, w) != (height, width):
            image = np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BICUBIC))
        x = (image.astype(np.float64) * (1 / 255)).astype(np.float32)
        x = (x - self.image_mean) / self.image_std
        return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)

    def _resize_normalise_video(self, frames: np.ndarray) -> np.ndarray:
        """uint8 (T, H, W, 3) → float32 (T', 3, h, w), T' the next multiple of the temporal patch (the last frame
        repeated), as the official video processor (``Qwen2VLVideoProcessor``, torchvision backend) makes it:
        frames not yet at the ``smart_resize`` size are resized as qwen-omni-utils resizes them
        (:func:`~relax_gym.omni.decode.resize_frames`; frames it picked are at that size already), then rescale
        and normalise are fused as that backend fuses them: ``(x - mean * 255) / (std * 255)`` in float32 (not the
        image processor's ``(x / 255 - mean) / std``: the two differ in the last bits)."""
        _, height, width, _ = frames.shape
        h, w = smart_resize(height, width, self.patch_size * self.merge_size, self.video_min_pixels, self.video_max_pixels)
        frames = resize_frames(frames, h, w)
        pad = (-frames.shape[0]) % self.temporal_patch_size
        if pad:
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        # TorchvisionBackend._fuse_mean_std_and_rescale_factor: tensor(mean) * (1.0 / rescale_factor), in float32
        mean = torch.tensor(self.image_mean.tolist()) * (1.0 / (1 / 255))
        std = torch.tensor(self.image_std.tolist()) * (1.0 / (1 / 255))
        x = torch.from_numpy(np.require(frames, requirements=["C", "W"])).permute(0, 3, 1, 2).to(torch.float32)
        x = x.sub(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))  # torchvision's normalize: sub, then div
        return np.ascontiguousarray(x.numpy())

    def _patchify(self, x: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """float32 (T, C, H, W), T a multiple of tp → rows (gt, gh/m, gw/m, m, m), columns (C, tp, ps, ps)."""
        t, c, h, w = x.shape
        tp, ps, m = self.temporal_patch_size, self.patch_size, self.merge_size
        gt, gh, gw = t // tp, h // ps, w // ps
        x = x.reshape(gt, tp, c, gh // m, m, ps, gw // m, m, ps)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * ps * ps)), [gt, gh, gw]

    # -- HF-style call and batching -----------------------------------------------------------------------

    def __call__(self, text: str | Sequence[str], images: Sequence[Any] | None = None, videos: Sequence[Any] | None = None,
                 audio: Sequence[Any] | None = None, *, padding_side: str = "left", return_tensors: str = "pt") -> BatchFeature:
        """Text with one placeholder per media item (as the chat template writes them) → ``input_ids``,
        ``attention_mask`` and the media tensors; placeholders are expanded in order of appearance."""
        texts = [text] if isinstance(text, str) else list(text)
        queues = {"image": list(images or []), "video": list(videos or []), "audio": list(audio or [])}
        by_id = {v: k for k, v in self.media_token_ids.items()}
        rows: list[list[int]] = []
        encodings: list[MediaEncoding] = []
        for t in texts:
            ids: list[int] = []
            for token in self.encode_text(t):
                kind = by_id.get(token)
                if kind is None:
                    ids.append(token)
                    continue
                if not queues[kind]:
                    raise ValueError(f"the text has more {kind} placeholders than {kind} inputs")
                enc = self.encode_media(kind, queues[kind].pop(0))
                encodings.append(enc)
                ids.extend(enc.token_ids)
            rows.append(ids)
        left = {k: len(v) for k, v in queues.items() if v}
        if left:
            raise ValueError(f"media inputs without a placeholder in the text: {left}")
        batch = self.pad([(r, [1] * len(r)) for r in rows], padding_side=padding_side)
        batch.update(concat_media([e.tensors for e in encodings]))
        if self._audio_in_video(rows):
            batch["use_audio_in_video"] = torch.tensor(True)
        return BatchFeature(data={k: v for k, v in batch.items() if k != "loss_mask"}, tensor_type=None)

    def pad(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]], *, padding_side: str = "right") -> dict[str, torch.Tensor]:
        """``(ids, loss_mask)`` rows → ``input_ids``, ``attention_mask``, ``loss_mask`` (B, L), padded with the pad id."""
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        width = max((len(ids) for ids, _ in rows), default=0)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        loss = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (ids, mask) in enumerate(rows):
            n = len(ids)
            sl = slice(width - n, width) if padding_side == "left" else slice(0, n)
            input_ids[i, sl] = torch.as_tensor(list(ids), dtype=torch.long)
            attention[i, sl] = 1
            loss[i, sl] = torch.as_tensor(list(mask), dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss}

    def collate(self, rendered: Sequence[Any], *, padding_side: str = "right") -> dict[str, torch.Tensor]:
        """A batch of ``Rendered`` (anything with ``input_ids``, ``loss_mask``, ``mm``) → model inputs plus
        ``loss_mask``; media concatenated in batch order (the order the thinker consumes them). Use
        ``padding_side="left"`` for ``generate``, ``"right"`` for a training forward."""
        batch = self.pad([(r.input_ids, r.loss_mask) for r in rendered], padding_side=padding_side)
        batch.update(concat_media([r.mm for r in rendered]))
        if self._audio_in_video([r.input_ids for r in rendered]):
            batch["use_audio_in_video"] = torch.tensor(True)
        return batch

    def _audio_in_video(self, rows: Sequence[Sequence[int]]) -> bool:
        """Whether the rows' videos carry their audio (``<|vision_bos|><|audio_bos|>``): the thinker's rope
        (``get_rope_index(use_audio_in_video=...)``) takes one flag for the whole batch, so a batch that mixes
        such videos with plain ones (``<|vision_bos|><|VIDEO|>``) cannot be positioned right and is refused."""
        with_audio = plain = False
        for row in rows:
            ids = list(row)
            for i, token in enumerate(ids[:-1]):
                if token == self.vision_bos_token_id:
                    with_audio |= ids[i + 1] == self.audio_bos_token_id
                    plain |= ids[i + 1] == self.video_token_id
        if with_audio and plain:
            raise ValueError("a batch mixes videos rendered with their audio (use_audio_in_video) and videos without: "
                             "the thinker's rope positions take one use_audio_in_video flag per batch")
        return with_audio

    # -- persistence --------------------------------------------------------------------------------------
    #
    # The files are the published ones, readable by transformers: ``preprocessor_config.json`` holds what the
    # official image processor (Qwen2VLImageProcessor) and feature extractor (WhisperFeatureExtractor) read, with
    # the checkpoint's ``processor_class`` (``Qwen2_5OmniProcessor`` / ``Qwen3OmniMoeProcessor``: AutoProcessor picks
    # the class by it) and every other key the checkpoint's file held kept as it was; ``video_preprocessor_config.json``
    # holds the video limits and fps in Qwen2VLVideoProcessor's format (``size``: shortest / longest edge in pixels).
    # Nothing relax-gym-only is written: the audio placeholder rule follows ``processor_class`` (the family).

    @property
    def processor_class(self) -> str:
        """transformers' processor class of this checkpoint (as its preprocessor_config.json named it, else the
        family's)."""
        return getattr(self, "_processor_class", None) or PROCESSOR_CLASSES[self.audio_token_rule]

    def to_dict(self) -> dict[str, Any]:
        """Every setting in one flat dict (what two processors must share to encode alike; not a file format)."""
        fe = self.feature_extractor
        return {
            "processor_class": self.processor_class,
            "image_processor_type": "Qwen2VLImageProcessor",
            "feature_extractor_type": "WhisperFeatureExtractor",
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "video_min_pixels": self.video_min_pixels,
            "video_max_pixels": self.video_max_pixels,
            "image_mean": [float(v) for v in self.image_mean],
            "image_std": [float(v) for v in self.image_std],
            "default_video_fps": self.default_video_fps,
            "feature_size": fe.feature_size,
            "sampling_rate": fe.sampling_rate,
            "hop_length": fe.hop_length,
            "chunk_length": fe.chunk_length,
            "n_fft": fe.n_fft,
            "padding_value": fe.padding_value,
            "return_attention_mask": True,
            "audio_token_rule": self.audio_token_rule,
        }

    def preprocessor_dict(self) -> dict[str, Any]:
        """``preprocessor_config.json``: the image processor's and the feature extractor's keys (transformers'
        spelling), over the keys the checkpoint's own file held."""
        fe = self.feature_extractor
        out = {k: v for k, v in getattr(self, "_saved_preprocessor", {}).items() if k not in RELAX_GYM_KEYS}
        out.update({
            "processor_class": self.processor_class,
            "image_processor_type": out.get("image_processor_type", "Qwen2VLImageProcessor"),
            "feature_extractor_type": "WhisperFeatureExtractor",
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "image_mean": _json_floats(self.image_mean, out.get("image_mean")),
            "image_std": _json_floats(self.image_std, out.get("image_std")),
            "feature_size": fe.feature_size,
            "sampling_rate": fe.sampling_rate,
            "hop_length": fe.hop_length,
            "chunk_length": fe.chunk_length,
            "n_fft": fe.n_fft,
            "n_samples": fe.n_samples,
            "nb_max_frames": fe.nb_max_frames,
            "padding_value": fe.padding_value,
            "dither": float(getattr(fe, "dither", 0.0)),
            "return_attention_mask": True,
        })
        if isinstance(out.get("size"), dict):  # transformers 5 spelling of the same limits: keep both in step
            out["size"] = {**out["size"], "shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}
        return out

    def video_preprocessor_dict(self) -> dict[str, Any]:
        """``video_preprocessor_config.json`` (Qwen2VLVideoProcessor's keys) over the checkpoint's own file."""
        out = dict(getattr(self, "_saved_video_preprocessor", {}))
        out.update({
            "processor_class": self.processor_class,
            "video_processor_type": out.get("video_processor_type", "Qwen2VLVideoProcessor"),
            "size": {"shortest_edge": self.video_min_pixels, "longest_edge": self.video_max_pixels},
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "image_mean": _json_floats(self.image_mean, out.get("image_mean")),
            "image_std": _json_floats(self.image_std, out.get("image_std")),
            "fps": self.default_video_fps,
        })
        for key, value in (("min_pixels", self.video_min_pixels), ("max_pixels", self.video_max_pixels)):
            if key in out:  # the legacy spelling, where the checkpoint's file used it
                out[key] = value
        return out

    def save_pretrained(self, save_directory: str | Path) -> None:
        """The tokenizer files as transformers writes them (``tokenizer.json``, ``tokenizer_config.json``,
        ``chat_template.jinja``), ``preprocessor_config.json`` and ``video_preprocessor_config.json``."""
        path = Path(save_directory)
        path.mkdir(parents=True, exist_ok=True)
        shared, self.tokenizer.chat_template = self.tokenizer.chat_template, self.chat_template
        try:  # the tokenizer may be shared with processors of other templates (with_chat_template): put it back
            self.tokenizer.save_pretrained(str(path))
        finally:
            self.tokenizer.chat_template = shared
        (path / PREPROCESSOR_CONFIG).write_text(json.dumps(self.preprocessor_dict(), indent=2, sort_keys=True) + "\n")
        (path / VIDEO_PREPROCESSOR_CONFIG).write_text(json.dumps(self.video_preprocessor_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, tokenizer: PreTrainedTokenizerBase | None = None,
                        **overrides: Any) -> OmniProcessor:
        """Load from a directory written by :meth:`save_pretrained` or a published Qwen-Omni checkpoint (its
        tokenizer — or ``tokenizer`` when already loaded —, ``preprocessor_config.json``, chat template and
        ``video_preprocessor_config.json``; the torchvision video processor is never built). Video limits and fps
        come from the video config, else from the published defaults (:data:`VIDEO_MIN_PIXELS`,
        :data:`VIDEO_MAX_PIXELS`, 2 fps), never from the image limits."""
        path = Path(directory)
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(path))
        cfg: dict[str, Any] = {}
        if (path / PREPROCESSOR_CONFIG).is_file():
            cfg = json.loads((path / PREPROCESSOR_CONFIG).read_text())
        video_cfg: dict[str, Any] = {}
        if (path / VIDEO_PREPROCESSOR_CONFIG).is_file():
            video_cfg = json.loads((path / VIDEO_PREPROCESSOR_CONFIG).read_text())
        size = cfg.get("size") or {}
        min_pixels = cfg.get("min_pixels", size.get("shortest_edge", 56 * 56))
        max_pixels = cfg.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))
        vsize = video_cfg.get("size") or {}
        fe = WhisperFeatureExtractor(**{k: cfg[k] for k in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "dither") if k in cfg})
        chat_template = tokenizer.chat_template
        for name in ("chat_template.jinja", "chat_template.json"):
            if chat_template is None and (path / name).is_file():
                raw = (path / name).read_text()
                chat_template = json.loads(raw)["chat_template"] if name.endswith(".json") else raw
        saved_class = cfg.get("processor_class") if cfg.get("processor_class") in AUDIO_RULE_OF_CLASS else None
        kwargs: dict[str, Any] = dict(
            patch_size=cfg.get("patch_size", 14),
            temporal_patch_size=cfg.get("temporal_patch_size", 2),
            merge_size=cfg.get("merge_size", 2),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            # older relax-gym files kept the video limits in preprocessor_config.json (video_min_pixels ...)
            video_min_pixels=_first(video_cfg.get("min_pixels"), vsize.get("shortest_edge"), cfg.get("video_min_pixels"), VIDEO_MIN_PIXELS),
            video_max_pixels=_first(video_cfg.get("max_pixels"), vsize.get("longest_edge"), cfg.get("video_max_pixels"), VIDEO_MAX_PIXELS),
            image_mean=cfg.get("image_mean", OPENAI_CLIP_MEAN),
            image_std=cfg.get("image_std", OPENAI_CLIP_STD),
            feature_extractor=fe,
            default_video_fps=_first(video_cfg.get("fps"), cfg.get("default_video_fps"), 2.0),
            chat_template=chat_template,
            audio_token_rule=_first(cfg.get("audio_token_rule"), AUDIO_RULE_OF_CLASS.get(saved_class), "qwen2_5_omni"),
        )
        kwargs.update(overrides)
        processor = cls(tokenizer, **kwargs)
        processor._processor_class = saved_class
        processor._saved_preprocessor = cfg
        processor._saved_video_preprocessor = video_cfg
        return processor


def audio_token_count(frames: int) -> int:
    """Placeholder tokens for ``frames`` mel frames: the audio tower's ``_get_feat_extract_output_lengths``."""
    after_cnn = (frames - 1) // 2 + 1
    return (after_cnn - 2) // 2 + 1


def qwen3_omni_audio_token_count(frames: int) -> int:
    """Qwen3-Omni's audio tower (``_get_feat_extract_output_lengths``): 100-frame chunks give 13 tokens each, the
    remainder goes through three stride-2 convolutions (1 s → 100 frames → 13 tokens)."""
    rest = frames % 100
    return ((((rest - 1) // 2 + 1) - 1) // 2 + 1 - 1) // 2 + 1 + (frames // 100) * 13


#: The media encode cache's memory budget per processor (every role process holds one processor).
MEDIA_CACHE_BYTES = 512 * 2**20


def build_processor(cfg: Any) -> OmniProcessor:
    """The tiny policy's processor for ``cfg`` (a :class:`~relax_gym.trainer.policy.config.PolicyConfig`): the
    tokenizer trained in code and the media encoders at its sizes. Here, not beside the model, so a role that only
    renders prompts (an env worker) does not import transformers' modelling code (~2.4 s of CPU a process)."""
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


def _encoding_bytes(encoding: MediaEncoding) -> int:
    return sum(t.numel() * t.element_size() for t in encoding.tensors.values())


#: Placeholder-count rule per audio tower, named in ``preprocessor_config.json`` (``audio_token_rule``).
AUDIO_TOKEN_RULES = {"qwen2_5_omni": audio_token_count, "qwen3_omni": qwen3_omni_audio_token_count}

#: How each family's official processor pads Whisper features: (padding, truncation). ``Qwen2_5OmniProcessor``
#: forces ``padding="max_length"`` (the extractor's own truncation stays on); ``Qwen3OmniMoeProcessor``'s
#: audio defaults are ``padding=True, truncation=False``.
AUDIO_PADDING = {"qwen2_5_omni": ("max_length", True), "qwen3_omni": ("longest", False)}

#: Audio in video, per family: (position_id_per_seconds, seconds_per_chunk), the official processors' class
#: attributes (Qwen2_5OmniProcessor: 25, 2.0; Qwen3OmniMoeProcessor: 13.0, 2.0 -- it merges by time, no chunks).
AUDIO_IN_VIDEO = {"qwen2_5_omni": (25, 2.0), "qwen3_omni": (13.0, 2.0)}


def _chunk_sizes(times: np.ndarray, per_chunk: int) -> list[int]:
    """Token counts of the chunks ``Qwen2_5OmniProcessor.get_chunked_index`` cuts: chunk k holds the times in
    ``[k * per_chunk, (k + 1) * per_chunk)`` (a new chunk starts at each time that reaches the next bound; the
    last chunk may be empty only when there are no times)."""
    sizes: list[int] = []
    start, bound = 0, per_chunk
    for i, t in enumerate(times):
        if t >= bound:
            sizes.append(i - start)
            start = i
            bound += per_chunk
    sizes.append(len(times) - start)
    return sizes


def _json_floats(values: np.ndarray, saved: Any) -> list[float]:
    """float32 ``values`` for a JSON file: the checkpoint's own spelling when it gives the same float32 numbers
    (``0.48145466``, not ``0.48145467042922974``), else each value's shortest float32 spelling."""
    if isinstance(saved, list) and len(saved) == len(values) and np.array_equal(np.asarray(saved, dtype=np.float32), values):
        return [float(v) for v in saved]
    return [float(str(v)) for v in values]


def _first(*values: Any) -> Any:
    """The first value that is not None."""
    return next(v for v in values if v is not None)


def _fps_of(timestamps: np.ndarray) -> float | None:
    ts = np.asarray(timestamps, dtype=np.float64)
    if len(ts) < 2 or ts[-1] <= ts[0]:
        return None
    return float((len(ts) - 1) / (ts[-1] - ts[0]))
