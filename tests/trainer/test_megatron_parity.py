"""The same weights give the same token log-probs in HF and in Megatron (CPU, fp32, max abs diff <= 1e-4), on
rendered episodes with video, audio and image inputs: the 3-D multimodal rope reaches megatron-core's decoder."""

from __future__ import annotations

import torch

from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.tools.megatron_check import TOLERANCE, demonstration_batch, logprob_gap

from .megatron_fixtures import megatron_policy  # noqa: F401 - fixture


def test_hf_and_megatron_logprobs_agree_on_video_audio_and_image(megatron_policy):  # noqa: F811
    hf_model, actor = megatron_policy
    items = demonstration_batch(actor.processor, per_env=2)
    batch = actor.processor.collate(items)
    assert {"pixel_values_videos", "input_features", "pixel_values"} <= set(batch)  # all three towers run
    seen = []
    hook = actor.model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"]), with_kwargs=True)
    try:
        gap, tokens = logprob_gap(HFActor(hf_model, actor.processor, lr=1e-3), actor, items)
    finally:
        hook.remove()
    (positions,) = seen  # (3, B, T): temporal, height, width rows differ on media tokens
    assert positions.shape[0] == 3
    assert not torch.equal(positions[0], positions[1]) and not torch.equal(positions[1], positions[2])
    assert tokens > 50
    assert gap <= TOLERANCE


def test_a_changed_megatron_weight_changes_the_logprobs(megatron_policy):  # noqa: F811
    """The comparison can fail: one decoder weight nudged on the Megatron side only, the gap is far above 1e-4."""
    hf_model, actor = megatron_policy
    items = demonstration_batch(actor.processor, per_env=1)
    weight = actor.model.model.language_model.gpt.decoder.layers[1].mlp.linear_fc2.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.add_(0.05 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
        gap, _ = logprob_gap(HFActor(hf_model, actor.processor, lr=1e-3), actor, items)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert gap > 100 * TOLERANCE
