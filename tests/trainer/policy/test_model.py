"""The tiny Qwen2.5-Omni thinker: built from config, trains and generates on real env observations (video;
image + audio; a multi-turn tool conversation with two images), and saves / loads through ``path``."""

from __future__ import annotations

import pytest
import torch

import relax_gym
from relax_gym.omni import Message
from relax_gym.omni.render import extend, render
from relax_gym.trainer.policy.model import PolicyConfig, build_policy, mrope_sections, save_policy


def _inputs(batch):
    return {k: v for k, v in batch.items() if k != "loss_mask"}


def _train_step(model, processor, rendered):
    """One forward + backward on right-padded rows; loss on the loss-masked tokens (all tokens if none)."""
    batch = processor.collate(rendered, padding_side="right")
    model.zero_grad(set_to_none=True)
    out = model(**_inputs(batch), use_cache=False)
    logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    weight = batch["loss_mask"][:, 1:].float()
    if weight.sum() == 0:
        weight = batch["attention_mask"][:, 1:].float()
    loss = -(logp * weight).sum() / weight.sum()
    loss.backward()
    assert torch.isfinite(loss)
    grads = {name.split(".")[1] for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    return grads


def _generate(model, processor, rendered, n=8):
    batch = processor.collate(rendered, padding_side="left")
    torch.manual_seed(0)
    seq = model.generate(**_inputs(batch), max_new_tokens=n, do_sample=True)
    completion = seq[:, batch["input_ids"].shape[1]:]
    assert completion.shape[1] >= 1
    assert not set(completion.flatten().tolist()) & (set(processor.control_token_ids) - {processor.pad_token_id})
    return completion


def test_tiny_config(model, processor):
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 <= n <= 3e6, n
    text = model.config.text_config
    assert text.vocab_size == len(processor.tokenizer)
    head_dim = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2
    assert mrope_sections(128) == [16, 24, 24]
    cfg = model.config
    assert (cfg.image_token_id, cfg.video_token_id, cfg.audio_token_id) == (processor.image_token_id, processor.video_token_id, processor.audio_token_id)
    assert (cfg.vision_start_token_id, cfg.audio_start_token_id) == (processor.vision_bos_token_id, processor.audio_bos_token_id)
    gen = model.generation_config
    assert (gen.pad_token_id, gen.eos_token_id, gen.bos_token_id) == (processor.pad_token_id, processor.eos_token_id, None)
    assert processor.image_token_id in gen.suppress_tokens and processor.eos_token_id not in gen.suppress_tokens
    std = model.model.language_model.layers[0].mlp.up_proj.weight.std().item()
    assert 0.09 < std < 0.11  # init_range 0.1, not the library's 0.02


def test_build_is_deterministic(model):
    again, _ = build_policy(PolicyConfig())
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    other, _ = build_policy(PolicyConfig(seed=1))
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_video_observation_trains_and_generates(model, processor):
    env = relax_gym.make("nextqa-video")
    rendered = [render(env.reset(seed=s)[0], processor) for s in range(2)]
    assert rendered[0].num_media == {"image": 0, "video": 1, "audio": 0}
    assert "visual" in _train_step(model, processor, rendered)
    _generate(model, processor, rendered)


def test_image_and_audio_observation_trains_and_generates(model, processor):
    env = relax_gym.make("echo-ink")
    obs, info = env.reset(seed=0)
    gold = render(obs + [Message("assistant", info["gold"])], processor, add_generation_prompt=False)
    assert gold.num_media == {"image": 1, "video": 0, "audio": 1}
    assert set(gold.mm) == {"pixel_values", "image_grid_thw", "input_features", "feature_attention_mask"}
    grads = _train_step(model, processor, [gold, gold])
    assert {"visual", "audio_tower", "language_model"} <= grads
    _generate(model, processor, [render(obs, processor), render(env.reset(seed=1)[0], processor)])


def test_multi_turn_tool_conversation_with_two_images(model, processor):
    env = relax_gym.make("image-zoom")
    obs, info = env.reset(seed=0)
    turn0 = render(obs, processor)
    completion = _generate(model, processor, [turn0], n=6)  # a sampled turn, kept token for token
    action = info["gold"]  # the env is driven by the gold action; the rendering keeps the sampled ids
    new, _, _, _, info = env.step(action)
    sampled = completion[0].tolist()
    turn1 = extend(turn0, [Message("assistant", action), *new], assistant_token_ids=sampled)
    assert turn1.num_media["image"] == 2
    assert turn1.input_ids[: len(turn0)] == turn0.input_ids
    assert turn1.input_ids[len(turn0): len(turn0) + len(sampled)] == sampled
    assert torch.equal(turn1.mm["pixel_values"][: turn0.mm["pixel_values"].shape[0]], turn0.mm["pixel_values"])
    assert turn1.mm["image_grid_thw"].shape == (2, 3)
    _train_step(model, processor, [turn1])
    _generate(model, processor, [turn1, turn0])  # different lengths and media counts in one batch


def test_generate_and_training_forward_agree(model, processor):
    """The logits generate sampled from are the ones a training forward recomputes (3-D rope positions,
    left padding and media placement consistent): the basis of importance ratios in RL."""
    rendered = [render(relax_gym.make("echo-ink").reset(seed=s)[0], processor) for s in (0, 1)]
    batch = processor.collate(rendered, padding_side="left")
    torch.manual_seed(0)
    out = model.generate(**_inputs(batch), max_new_tokens=6, min_new_tokens=6, do_sample=True,
                         output_logits=True, return_dict_in_generate=True)
    prompt = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones_like(out.sequences[:, prompt:])], 1)
    logits = model(**{**_inputs(batch), "input_ids": out.sequences, "attention_mask": mask}, use_cache=False).logits
    torch.testing.assert_close(logits[:, prompt - 1:-1], torch.stack(out.logits, 1), atol=1e-4, rtol=1e-4)


def test_save_and_load_through_path(model, processor, tmp_path):
    save_policy(model, processor, tmp_path / "policy")
    loaded, loaded_processor = build_policy(PolicyConfig(path=str(tmp_path / "policy")))
    assert loaded_processor.to_dict() == processor.to_dict()
    assert loaded_processor.chat_template == processor.chat_template
    obs, _ = relax_gym.make("echo-ink").reset(seed=3)
    a, b = render(obs, processor), render(obs, loaded_processor)
    assert a.input_ids == b.input_ids and all(torch.equal(a.mm[k], b.mm[k]) for k in a.mm)
    batch = _inputs(processor.collate([a], padding_side="left"))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
    gen = loaded.generation_config
    assert (gen.pad_token_id, gen.eos_token_id, gen.bos_token_id) == (processor.pad_token_id, processor.eos_token_id, None)
    with pytest.raises(FileNotFoundError):
        build_policy(PolicyConfig(path=str(tmp_path / "missing")))


def test_loads_the_thinker_out_of_a_full_omni_checkpoint(model, processor, tmp_path):
    """A Qwen2.5-Omni checkpoint holds thinker, talker and vocoder under ``thinker.`` / ``talker.`` / ...:
    ``path`` takes the thinker's config and weights and skips the rest."""
    import json

    from safetensors.torch import save_file

    processor.save_pretrained(tmp_path)
    weights = {f"thinker.{k}": v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    weights["talker.codec_head.weight"] = torch.zeros(2, 2)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniForConditionalGeneration"],
        "enable_audio_output": False, "thinker_config": model.config.to_dict(),
    }))
    loaded, _ = build_policy(PolicyConfig(path=str(tmp_path)))
    obs, _ = relax_gym.make("nextqa-video").reset(seed=0)
    batch = _inputs(processor.collate([render(obs, processor)]))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
