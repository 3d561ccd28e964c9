"""HF <-> Megatron weight conversion: the fused layouts by hand, bit-exact round trips (dict level and through a live
megatron-core GPTModel), one clear error for a wrong state dict."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.actors.megatron.convert import DecoderShape, hf_to_megatron, megatron_to_hf

from .megatron_fixtures import megatron_policy  # noqa: F401 - fixture

P = "model.language_model."


def test_qkv_rows_are_grouped_query_heads_then_key_then_value():
    """2 key/value groups of 2 query heads, head_dim 1: rows q0 q1 k0 v0 | q2 q3 k1 v1 (each row its own value)."""
    shape = DecoderShape(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=1, tied=True)
    hf = {f"{P}embed_tokens.weight": torch.zeros(3, 1), f"{P}norm.weight": torch.ones(1),
          f"{P}layers.0.mlp.gate_proj.weight": torch.tensor([[1.0], [2.0]]),
          f"{P}layers.0.mlp.up_proj.weight": torch.tensor([[3.0], [4.0]]),
          f"{P}layers.0.mlp.down_proj.weight": torch.zeros(1, 2)}
    for name, rows in {"q": [10.0, 11.0, 12.0, 13.0], "k": [20.0, 21.0], "v": [30.0, 31.0]}.items():
        hf[f"{P}layers.0.self_attn.{name}_proj.weight"] = torch.tensor(rows)[:, None]
        hf[f"{P}layers.0.self_attn.{name}_proj.bias"] = -torch.tensor(rows)
    mc = hf_to_megatron(hf, shape, prefix=P)
    qkv = [10.0, 11.0, 20.0, 30.0, 12.0, 13.0, 21.0, 31.0]
    assert mc["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0].tolist() == qkv
    assert mc["decoder.layers.0.self_attention.linear_qkv.bias"].tolist() == [-x for x in qkv]
    assert mc["decoder.layers.0.mlp.linear_fc1.weight"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]  # gate rows, then up
    assert "output_layer.weight" not in mc  # tied: the head is the embedding table
    back = megatron_to_hf(mc, shape, prefix=P)
    assert back[f"{P}layers.0.self_attn.k_proj.weight"][:, 0].tolist() == [20.0, 21.0]
    assert back["lm_head.weight"] is back[f"{P}embed_tokens.weight"]


def test_thinker_round_trip_is_bit_exact():
    model, _ = build_policy()
    hf = model.state_dict()
    shape = DecoderShape.of(model.config.get_text_config())
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.tied) == (4, 2, 32, True)
    back = megatron_to_hf(hf_to_megatron(hf, shape, prefix=P), shape, prefix=P)
    decoder = {k for k in hf if k.startswith(P) or k == "lm_head.weight"}
    assert set(back) == decoder
    assert all(torch.equal(back[k], hf[k]) for k in decoder)


def test_untied_qwen3_round_trip_is_bit_exact():
    """Qwen3: no qkv bias, per-head q/k norms, an lm_head of its own."""
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(config).state_dict()
    shape = DecoderShape.of(config)
    mc = hf_to_megatron(hf, shape)
    assert "decoder.layers.1.self_attention.q_layernorm.weight" in mc and "output_layer.weight" in mc
    assert not any(k.endswith("linear_qkv.bias") for k in mc)
    back = megatron_to_hf(mc, shape)
    assert set(back) == set(hf) and all(torch.equal(back[k], hf[k]) for k in hf)


def test_a_state_dict_of_another_family_is_one_clear_error():
    model, _ = build_policy()
    with pytest.raises(KeyError, match="no tensor 'model.embed_tokens.weight'"):
        hf_to_megatron(model.state_dict(), DecoderShape.of(model.config.get_text_config()), prefix="model.")


def test_live_gpt_model_round_trip_is_bit_exact(megatron_policy):  # noqa: F811
    """The Megatron thinker's weights, read back under HF names, equal the HF thinker's bit for bit, in its order."""
    hf_model, mc_actor = megatron_policy
    reference = hf_model.state_dict()
    converted = mc_actor.state_dict()
    assert list(converted) == list(reference)
    assert all(torch.equal(converted[k], reference[k]) for k in reference)
