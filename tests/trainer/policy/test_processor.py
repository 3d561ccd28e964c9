"""The torchvision-free processor: image patches as Qwen's PIL image processor makes them, video patch layout,
Whisper audio features and token counts, placeholder expansion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from relax_gym.omni import DecodedAudio, DecodedVideo


@pytest.mark.parametrize("shape", [(64, 64, 3), (48, 48, 3), (78, 78, 3), (200, 120, 3), (20, 30, 3)])
def test_image_patches_match_qwen2vl_pil_image_processor(processor, shape):
    image = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    reference = Qwen2VLImageProcessorPil(patch_size=processor.patch_size, merge_size=processor.merge_size,
                                         temporal_patch_size=processor.temporal_patch_size,
                                         min_pixels=processor.min_pixels, max_pixels=processor.max_pixels)
    theirs = reference(images=[image], return_tensors="pt")
    mine = processor.encode_image(image)
    assert torch.equal(mine.tensors["image_grid_thw"], theirs["image_grid_thw"])
    torch.testing.assert_close(mine.tensors["pixel_values"], theirs["pixel_values"], atol=1e-5, rtol=0)
    assert mine.num_tokens == int(theirs["image_grid_thw"].prod()) // processor.merge_size**2
    assert set(mine.token_ids) == {processor.image_token_id}


def test_video_of_identical_frames_equals_the_image(processor):
    frame = np.random.default_rng(1).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    video = processor.encode_video(np.stack([frame] * processor.temporal_patch_size), fps=2.0)
    image = processor.encode_image(frame)
    # same pixels, rounding apart: the official video processor normalises as (x - 255 mean) / (255 std), the image
    # processor as (x / 255 - mean) / std (tests/trainer/policy/test_official_parity.py checks each bit for bit)
    torch.testing.assert_close(video.tensors["pixel_values_videos"], image.tensors["pixel_values"], atol=1e-6, rtol=0)
    assert torch.equal(video.tensors["video_grid_thw"], image.tensors["image_grid_thw"])
    assert set(video.token_ids) == {processor.video_token_id}


def test_video_patch_layout_time_then_merged_blocks(processor):
    """Rows run (t, h/m, w/m, m, m); columns (C, tp, ps, ps): a frame whose pixels encode (t, y, x) can be read back."""
    tp, ps, m = processor.temporal_patch_size, processor.patch_size, processor.merge_size
    t_n, size = 5, 32  # odd T: padded with the last frame
    frames = np.zeros((t_n, size, size, 3), np.uint8)
    for t in range(t_n):
        frames[t, :, :, 0] = 40 * t
    frames[:, :, :, 1] = (np.arange(size) * 4)[None, :, None]  # green grows with y
    frames[:, :, :, 2] = (np.arange(size) * 4)[None, None, :]  # blue grows with x
    enc = processor.encode_video(frames, fps=4.0)
    gt, gh, gw = enc.tensors["video_grid_thw"][0].tolist()
    assert (gt, gh, gw) == ((t_n + 1) // tp, size // ps, size // ps)
    assert enc.tensors["video_second_per_grid"].tolist() == [pytest.approx(tp / 4.0)]
    px = enc.tensors["pixel_values_videos"].reshape(gt, gh // m, gw // m, m, m, 3, tp, ps, ps)
    mean, std = processor.image_mean, processor.image_std
    raw = px.numpy() * std[None, None, None, None, None, :, None, None, None] + mean[None, None, None, None, None, :, None, None, None]
    raw = np.rint(raw * 255)
    for t in range(gt):
        for k in range(tp):
            frame_index = min(t * tp + k, t_n - 1)
            assert np.all(raw[t, :, :, :, :, 0, k] == 40 * frame_index)
    # top-left pixel of block (bh, bw), sub-patch (i, j) sits at y = (bh*m + i)*ps, x = (bw*m + j)*ps
    for bh, bw, i, j in [(0, 0, 0, 0), (1, 0, 1, 0), (0, 1, 0, 1), (1, 1, 1, 1)]:
        assert raw[0, bh, bw, i, j, 1, 0, 0, 0] == 4 * (bh * m + i) * ps
        assert raw[0, bh, bw, i, j, 2, 0, 0, 0] == 4 * (bw * m + j) * ps


def test_decoded_video_uses_its_timestamps_for_seconds_per_grid(processor):
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    video = DecodedVideo(frames=frames, timestamps=np.arange(8) / 8.0, native_fps=8.0, duration_s=1.0)
    enc = processor.encode_media("video", video)
    assert enc.tensors["video_second_per_grid"].item() == pytest.approx(processor.temporal_patch_size / 8.0)


def test_audio_features_and_token_count(model, processor):
    wave = (0.1 * np.sin(np.arange(16_000) * 2 * np.pi * 440 / 16_000)).astype(np.float32)
    enc = processor.encode_media("audio", DecodedAudio(waveform=wave, sample_rate=16_000))
    feats, mask = enc.tensors["input_features"], enc.tensors["feature_attention_mask"]
    frames = processor.feature_extractor.nb_max_frames
    assert feats.shape == (1, 128, frames) and mask.shape == (1, frames)
    assert int(mask.sum()) == 100
    _, expected = model.model.audio_tower._get_feat_extract_output_lengths(mask.sum(-1))
    assert enc.num_tokens == int(expected) == 25  # 1 s → 25 audio tokens
    with pytest.raises(ValueError, match="sampled at 16000"):
        processor.encode_audio(wave, sample_rate=8000)


def test_call_expands_placeholders_in_order(processor):
    image = np.zeros((32, 48, 3), np.uint8)
    wave = np.zeros(8000, np.float32)
    text = "<|vision_bos|><|IMAGE|><|vision_eos|> and <|audio_bos|><|AUDIO|><|audio_eos|>"
    out = processor([text, "no media"], images=[image], audio=[wave])
    ids = out["input_ids"]
    assert ids.shape[0] == 2 and out["attention_mask"][1].sum() < ids.shape[1]  # left padded
    n_image = int(out["image_grid_thw"].prod()) // 4
    assert int((ids == processor.image_token_id).sum()) == n_image
    assert int((ids == processor.audio_token_id).sum()) == 12  # 0.5 s → 50 frames → 12 tokens
    with pytest.raises(ValueError, match="without a placeholder"):
        processor("text only", images=[image])
