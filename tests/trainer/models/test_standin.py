"""Stand-in checkpoints in the published layout: the files, the names and shapes of the tensors, the tokenizer and
that transformers' own classes read them as they read the published checkpoints."""

from __future__ import annotations

import json
import math
import zlib

import pytest
import torch
from safetensors import safe_open

from relax_gym.trainer.models.published import PUBLISHED, published_config
from relax_gym.trainer.models.standin import INIT_STD, _plan_shards, _random_tensor, published_tensor_shapes, write_standin

PUBLISHED_FILES_Q25 = {
    "added_tokens.json", "chat_template.json", "config.json", "generation_config.json", "merges.txt",
    "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
    "model.safetensors.index.json", "preprocessor_config.json", "special_tokens_map.json", "spk_dict.pt",
    "tokenizer.json", "tokenizer_config.json", "vocab.json",
}


def _header_shapes(directory):
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shapes, dtypes = {}, set()
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(directory / file), "pt") as f:
            for name in f.keys():
                shapes[name] = (tuple(f.get_slice(name).get_shape()), file)
                dtypes.add(f.get_slice(name).get_dtype())
    return index, shapes, dtypes


def test_files_and_config_match_the_published_layout(standin_3b):
    assert {p.name for p in standin_3b.iterdir()} == PUBLISHED_FILES_Q25
    config = json.loads((standin_3b / "config.json").read_text())
    full = published_config("qwen2.5-omni-3b")
    assert set(config) == set(full)  # same keys as the published config.json
    assert set(config["thinker_config"]) == set(full["thinker_config"])
    text = config["thinker_config"]["text_config"]
    assert (text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"], text["vocab_size"],
            text["intermediate_size"]) == (2048, 16, 2, 151936, 11008)
    assert text["num_hidden_layers"] == 1 and full["thinker_config"]["text_config"]["num_hidden_layers"] == 36
    vision = config["thinker_config"]["vision_config"]
    assert (vision["hidden_size"], vision["depth"], vision["fullatt_block_indexes"], vision["window_size"]) == (1280, 2, [1], 112)
    assert config["thinker_config"]["audio_config"]["d_model"] == 1280
    assert config["torch_dtype"] == "bfloat16"
    assert json.loads((standin_3b / "preprocessor_config.json").read_text())["processor_class"] == "Qwen2_5OmniProcessor"


def test_tensors_have_the_published_names_shapes_and_shards(standin_3b):
    index, shapes, dtypes = _header_shapes(standin_3b)
    assert dtypes == {"BF16", "F32"}  # the vocoder (token2wav) in float32, as published
    assert {n: f for n, (_, f) in shapes.items()} == index["weight_map"]  # the index names each tensor's shard
    assert index["metadata"]["total_size"] == sum((4 if n.startswith("token2wav.") else 2) * math.prod(s)
                                                  for n, (s, _) in shapes.items())
    assert shapes["thinker.model.embed_tokens.weight"][0] == (151936, 2048)
    assert shapes["thinker.lm_head.weight"][0] == (151936, 2048)
    assert shapes["thinker.model.layers.0.self_attn.k_proj.weight"][0] == (256, 2048)  # 2 kv heads x 128
    assert shapes["thinker.model.layers.0.self_attn.q_proj.bias"][0] == (2048,)
    assert shapes["thinker.visual.blocks.1.attn.q.weight"][0] == (1280, 1280)  # Qwen2.5-Omni: separate q, k, v
    assert shapes["thinker.visual.merger.mlp.2.weight"][0] == (2048, 5120)
    assert shapes["thinker.audio_tower.proj.weight"][0] == (2048, 1280)
    assert {n.split(".")[0] for n in shapes} == {"thinker", "talker", "token2wav"}
    assert not any(".language_model." in n for n in shapes)  # transformers 5's module names are not the published ones
    assert len(set(index["weight_map"].values())) == 3
    assert shapes == {n: (s, index["weight_map"][n]) for n, s in published_tensor_shapes("qwen2.5-omni-3b", 1).items()}


def test_tokenizer_has_qwens_special_tokens_at_their_ids(standin_3b):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(standin_3b))
    assert len(tok) == 151643 + 22
    for text, token_id, _ in PUBLISHED["qwen2.5-omni-3b"].special_tokens:
        assert tok.convert_tokens_to_ids(text) == token_id, text
    assert (tok.eos_token, tok.pad_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", "<|endoftext|>", 151645, 151643)
    assert (tok.image_token, tok.audio_bos_token, tok.video_token) == ("<|IMAGE|>", "<|audio_bos|>", "<|VIDEO|>")
    template = json.loads((standin_3b / "chat_template.json").read_text())["chat_template"]  # the processor's file
    assert tok.chat_template is None  # as published: the template lives with the processor, not the tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which way?"}]}],
                                   chat_template=template, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "<|vision_bos|><|VIDEO|><|vision_eos|>Which way?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 151644 and 151656 in ids and tok.decode(ids) == text
    word = "The red square moves left."
    assert tok.decode(tok.encode(word)) == word and max(tok.encode(word)) < 151643


def test_transformers_thinker_class_reads_every_thinker_tensor(standin_3b):
    """The full layout's ``thinker.*`` tensors are exactly what transformers' thinker class expects (its load-time
    renames of the published names), talker and token2wav left aside."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniThinkerForConditionalGeneration

    config = Qwen2_5OmniConfig.from_pretrained(str(standin_3b)).thinker_config
    with torch.device("meta"):
        model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model, info = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
        str(standin_3b), config=config, dtype=torch.bfloat16, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    emb = model.get_input_embeddings().weight
    assert emb.dtype == torch.bfloat16 and 0.015 < emb[:1000].float().std().item() < 0.025


def test_thinker_only_layout_loads_with_transformers(tmp_path):
    from transformers import AutoConfig, Qwen2_5OmniThinkerForConditionalGeneration

    out = write_standin("qwen2.5-omni-3b", tmp_path / "thinker", layers=1, thinker_only=True)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert not any(n.startswith(("thinker.", "talker.", "token2wav.")) for n in index["weight_map"])
    assert "lm_head.weight" in index["weight_map"] and "visual.blocks.0.attn.q.weight" in index["weight_map"]
    config = AutoConfig.from_pretrained(str(out))
    assert config.model_type == "qwen2_5_omni_thinker"
    _, info = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(str(out), dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_qwen3_omni_names_one_tensor_per_expert():
    """Qwen3-Omni publishes its experts unfused (``mlp.experts.E.gate_proj.weight``); transformers fuses them at
    load. Shapes only (the meta device): 128 experts x 3 matrices per MoE layer, at 768 x 2048."""
    shapes = published_tensor_shapes("qwen3-omni-30b-a3b", 1)
    experts = [n for n in shapes if n.startswith("thinker.model.layers.0.mlp.experts.")]
    assert len(experts) == 128 * 3
    assert shapes["thinker.model.layers.0.mlp.experts.127.gate_proj.weight"] == (768, 2048)
    assert shapes["thinker.model.layers.0.mlp.experts.0.down_proj.weight"] == (2048, 768)
    assert shapes["thinker.model.layers.0.mlp.gate.weight"] == (128, 2048)
    assert shapes["thinker.model.embed_tokens.weight"] == (152064, 2048)
    assert shapes["thinker.visual.pos_embed.weight"] == (2304, 1152)
    assert {n.split(".")[0] for n in shapes} == {"thinker", "talker", "code2wav"}
    full = published_tensor_shapes("qwen3-omni-30b-a3b")  # full depth: the published count
    assert sum(math.prod(s) for s in full.values()) == pytest.approx(35.26e9, rel=2e-3)


def test_full_depth_7b_layout_has_the_published_size():
    """The published Qwen2.5-Omni-7B index says 22,366,403,936 bytes: our full-depth layout (bf16 thinker and talker,
    float32 token2wav) comes within 0.02 % of it (3.85 MB, about a thousandth of a layer: buffers we do not write)."""
    shapes = published_tensor_shapes("qwen2.5-omni-7b")
    size = sum((4 if n.startswith("token2wav.") else 2) * math.prod(s) for n, s in shapes.items())
    assert size == pytest.approx(22_366_403_936, rel=2e-4)


def test_weights_are_a_function_of_seed_and_name():
    a = _random_tensor("thinker.model.layers.0.mlp.up_proj.weight", (64, 32), torch.bfloat16, 0)
    assert torch.equal(a, _random_tensor("thinker.model.layers.0.mlp.up_proj.weight", (64, 32), torch.bfloat16, 0))
    assert not torch.equal(a, _random_tensor("thinker.model.layers.0.mlp.up_proj.weight", (64, 32), torch.bfloat16, 1))
    assert not torch.equal(a, _random_tensor("thinker.model.layers.0.mlp.gate_proj.weight", (64, 32), torch.bfloat16, 0))
    assert torch.equal(_random_tensor("x.norm.weight", (8,), torch.float32, 0), torch.ones(8))
    assert torch.equal(_random_tensor("x.proj.bias", (8,), torch.float32, 0), torch.zeros(8))


def test_weights_drawn_slice_by_slice_are_those_of_one_draw_per_slice():
    """A tensor over 16 M values is filled in slices of whole rows through one reused buffer: the values are those
    of one ``randn`` per slice from the name's generator times the init std (the ragged last slice included), so
    stand-ins written before and after that buffer came in hold the same bytes."""
    shape = ((1 << 24) // 1024 + 3, 1024)  # a slice of 16,384 rows, then one of 3
    gen = torch.Generator().manual_seed(zlib.crc32(b"0:w"))
    expected = torch.cat([torch.randn((16_384, 1024), generator=gen) * INIT_STD,
                          torch.randn((3, 1024), generator=gen) * INIT_STD]).to(torch.bfloat16)
    got = _random_tensor("w", shape, torch.bfloat16, 0)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


def test_shard_plan_keeps_order_and_fills_every_shard():
    shapes = {f"t{i}": (s,) for i, s in enumerate([100, 1, 1, 1, 50, 50, 1])}
    groups = _plan_shards(shapes, 3, dict.fromkeys(shapes, 2))
    assert [n for g in groups for n in g] == list(shapes) and all(groups) and len(groups) == 3
    assert groups[0] == ["t0"]  # the big first tensor fills a shard on its own
    assert _plan_shards({"a": (1,), "b": (1,)}, 5, {"a": 2, "b": 2}) == [["a"], ["b"]]
