"""The size report (relax_gym/trainer/models/sizes.py): parameter counts, bytes per rank, KV cache per token.

Everything runs on the meta device or on safetensors headers: no weights are allocated. The acceptance test of
issue 34 item 5 is :func:`test_7b_tp2_matches_the_hand_computation`: its figures are arithmetic on the published
Qwen2.5-Omni-7B widths, written out here, not computed by the module's helpers."""

from __future__ import annotations

import functools
import json
import math
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from relax_gym.trainer.models.published import PUBLISHED, published_config
from relax_gym.trainer.models.sizes import (TRAINED_PARTS, closed_form, count_thinker, format_report,
                                            kv_cache_bytes_per_token, measure_checkpoint, padded_vocab,
                                            predict_from_standin, size_report)
from relax_gym.trainer.models.standin import INDEX_FILE, published_tensor_shapes

MODELS = ("qwen2.5-omni-3b", "qwen2.5-omni-7b", "qwen3-omni-30b-a3b")
GiB = 2**30

# -- Qwen2.5-Omni-7B's published widths (config.json of Qwen/Qwen2.5-Omni-7B) ------------------------------------
H, I, L, HEADS, KV, HD, V = 3584, 18944, 28, 28, 4, 128, 152064  # text: untied lm_head, q/k/v biases
VC, VI, VD, VHEADS, PATCH, TPATCH, VOUT = 1280, 3420, 32, 16, 14, 2, 3584  # vision, merger 2x2 -> 3584
AD, AF, AL, AHEADS, MELS, AOUT = 1280, 5120, 32, 20, 128, 3584  # audio


def test_7b_widths_are_the_published_ones_and_transformers_defaults() -> None:
    """The numbers above are what PUBLISHED holds, and (but one) transformers' Qwen2_5OmniThinkerConfig defaults."""
    from transformers import Qwen2_5OmniThinkerConfig

    thinker = PUBLISHED["qwen2.5-omni-7b"].config["thinker_config"]
    t, v, a = thinker["text_config"], thinker["vision_config"], thinker["audio_config"]
    assert (t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"], t["num_attention_heads"],
            t["num_key_value_heads"], t["vocab_size"], t["tie_word_embeddings"]) == (H, I, L, HEADS, KV, V, False)
    assert t["hidden_size"] // t["num_attention_heads"] == HD
    assert (v["hidden_size"], v["intermediate_size"], v["depth"], v["num_heads"], v["patch_size"],
            v["temporal_patch_size"], v["spatial_merge_size"], v["out_hidden_size"]) == (VC, VI, VD, VHEADS, PATCH,
                                                                                         TPATCH, 2, VOUT)
    assert (a["d_model"], a["encoder_ffn_dim"], a["encoder_layers"], a["encoder_attention_heads"], a["num_mel_bins"],
            a["output_dim"]) == (AD, AF, AL, AHEADS, MELS, AOUT)

    d = Qwen2_5OmniThinkerConfig()
    dt, dv, da = d.text_config, d.vision_config, d.audio_config
    assert (dt.hidden_size, dt.intermediate_size, dt.num_hidden_layers, dt.num_attention_heads,
            dt.num_key_value_heads, dt.vocab_size) == (H, I, L, HEADS, KV, V)
    assert d.tie_word_embeddings is False  # transformers ties the thinker's head by the thinker's flag
    assert (dv.intermediate_size, dv.depth, dv.num_heads, dv.patch_size, dv.temporal_patch_size,
            dv.spatial_merge_size, dv.out_hidden_size) == (VI, VD, VHEADS, PATCH, TPATCH, 2, VOUT)
    assert dv.hidden_size == 3584 != VC  # transformers' default vision width is the 7B's *output* width, not 1280
    assert (da.d_model, da.encoder_ffn_dim, da.encoder_layers, da.encoder_attention_heads, da.num_mel_bins,
            da.output_dim) == (AD, AF, AL, AHEADS, MELS, AOUT)


def test_7b_tp2_matches_the_hand_computation() -> None:
    """Issue 34's acceptance: the 7B at TP2, every figure by hand from the published widths."""
    embedding = V * H  # 152064 x 3584
    lm_head = V * H  # untied
    attention = L * ((H * HEADS * HD + HEADS * HD)  # q_proj + bias
                     + 2 * (H * KV * HD + KV * HD)  # k_proj, v_proj + biases
                     + HEADS * HD * H)  # o_proj, no bias
    mlp = L * 3 * H * I  # gate, up, down
    norms = L * 2 * H + H  # input + post-attention RMSNorm per layer, final norm
    vision = (VC * 3 * TPATCH * PATCH * PATCH  # patch embedding (conv, no bias)
              + VD * (2 * VC  # two RMSNorms
                      + 4 * (VC * VC + VC)  # q, k, v, proj with biases
                      + 2 * (VC * VI + VI) + (VI * VC + VC))  # gate, up, down with biases
              + VC  # merger's RMSNorm
              + (4 * VC) * (4 * VC) + 4 * VC  # merger MLP over 2x2 merged patches
              + (4 * VC) * VOUT + VOUT)  # -> the text width
    audio = ((AD * MELS * 3 + AD) + (AD * AD * 3 + AD)  # conv1, conv2 (kernel 3)
             + 2 * AOUT  # audio bos / eos embeddings
             + AL * (AD * AD + 3 * (AD * AD + AD)  # k_proj (no bias), q / v / out_proj
                     + 2 * 2 * AD  # two LayerNorms
                     + (AD * AF + AF) + (AF * AD + AD))  # fc1, fc2
             + 2 * AD  # ln_post
             + AD * AOUT + AOUT)  # proj
    assert (embedding, attention, mlp, vision, audio) == (544_997_376, 822_212_608, 5_703_204_864, 676_550_144,
                                                          639_647_232)
    thinker = embedding + lm_head + attention + mlp + norms + vision + audio
    assert thinker == 8_931_813_888

    # TP2: matrices and the (already 128-aligned) vocabulary halved, norms and towers whole on every rank
    assert V % 128 == 0
    rank = embedding // 2 + lm_head // 2 + attention // 2 + mlp // 2 + norms + vision + audio
    assert rank == 5_124_107_776
    weights, grads, master, moments = rank * 2, rank * 2, rank * 4, rank * 8  # bf16, bf16, fp32, 2 x fp32
    kv_token = 2 * L * KV * HD * 2  # K and V, bf16
    kv_rank = 2 * L * (KV // 2) * HD * 2

    report = size_report("qwen2.5-omni-7b", tp=2)
    expected_parts = dict.fromkeys(TRAINED_PARTS, 0)
    expected_parts.update({"text.embedding": embedding, "text.lm_head": lm_head, "text.attention": attention,
                           "text.mlp": mlp, "text.norms": norms, "vision": vision, "audio": audio})
    assert report.parts == expected_parts
    assert report.trained == thinker
    assert len(report.stages) == 1
    big = report.largest
    assert big.total_params == rank
    assert (big.weights, big.grads, big.master, big.moments) == (weights, grads, master, moments)
    assert big.total == rank * 16 == 81_985_724_416
    assert (report.kv_bytes_per_token, report.kv_bytes_per_token_per_rank, report.kv_heads_per_rank) == (
        kv_token, kv_rank, 2)
    assert kv_token == 57_344
    text = format_report(report)
    assert "76.36 GiB" in text and "5,124,107,776" in text and "56.0 KiB" in text and "28.0 KiB" in text


@pytest.mark.parametrize("name", MODELS)
def test_closed_form_equals_the_meta_count(name: str) -> None:
    counted, untrained = count_thinker(name)
    assert closed_form(name) == counted.parts
    assert set(untrained) == ({"talker", "token2wav"} if name.startswith("qwen2.5") else {"talker", "code2wav"})
    assert all(n > 0 for n in untrained.values())


def test_published_totals() -> None:
    """Whole checkpoints: the model cards' sizes (10.7 B for the 7B, 35.3 B for the 30B-A3B)."""
    r7, r30 = size_report("qwen2.5-omni-7b"), size_report("qwen3-omni-30b-a3b")
    assert r7.trained + sum(r7.untrained.values()) == 10_732_225_408
    assert r30.trained + sum(r30.untrained.values()) == 35_259_818_545
    assert r30.parts["text.experts"] == 48 * 128 * 3 * 2048 * 768
    assert r30.parts["text.router"] == 48 * 128 * 2048
    assert r30.parts["text.mlp"] == 0 and r30.parts["text.shared_experts"] == 0


def test_30b_a3b_at_ep2_splits_the_experts() -> None:
    one = size_report("qwen3-omni-30b-a3b", dp=2)
    two = size_report("qwen3-omni-30b-a3b", ep=2, dp=2)
    experts = 48 * 128 * 3 * 2048 * 768
    assert one.largest.total_params == one.trained
    assert two.largest.expert_params == experts // 2
    assert two.largest.total_params == one.trained - experts // 2
    assert two.largest.total == two.largest.total_params * 16
    # tensor parallel also splits each expert (expert tensor parallel size = tp) and the vocabulary
    four = size_report("qwen3-omni-30b-a3b", tp=2, ep=2, dp=2)
    assert four.largest.expert_params == experts // 4
    # ZeRO-1: master weights and moments of dense params over dp (4), of experts over dp / ep (2)
    zero = size_report("qwen3-omni-30b-a3b", ep=2, dp=4, distributed_optimizer=True)
    dense = zero.largest.total_params - experts // 2
    assert zero.largest.master == (dense // 4 + experts // 4) * 4
    assert zero.largest.moments == (dense // 4 + experts // 4) * 8
    assert zero.largest.weights == zero.largest.total_params * 2


def test_pp2_reports_the_largest_stage() -> None:
    r = size_report("qwen2.5-omni-7b", pp=2)
    p = r.parts
    layer = (p["text.attention"] + p["text.mlp"] + p["text.norms"] - H) // L
    first = p["text.embedding"] + 14 * layer + p["vision"] + p["audio"]
    last = 14 * layer + H + p["text.lm_head"]
    assert [s.total_params for s in r.stages] == [first, last]
    assert [s.layers for s in r.stages] == [(0, 14), (14, 28)]
    assert r.largest.stage == 0 and r.largest.total == first * 16

    moe = size_report("qwen3-omni-30b-a3b", pp=2)
    m = moe.parts
    layer = (m["text.attention"] + m["text.experts"] + m["text.router"] + m["text.norms"] - 2048) // 48
    first = m["text.embedding"] + 24 * layer + m["vision"] + m["audio"]
    last = 24 * layer + 2048 + m["text.lm_head"]
    assert [s.total_params for s in moe.stages] == [first, last]
    assert moe.largest.stage == 0


def test_tied_head_counts_once_and_pp_copies_it() -> None:
    config = published_config("qwen2.5-omni-3b")["thinker_config"]  # a thinker config: no talker to build
    config["tie_word_embeddings"] = True
    config["text_config"]["tie_word_embeddings"] = True
    one = size_report(config)
    assert one.parts["text.lm_head"] == 0 and one.closed_form == one.parts
    assert one.largest.params["text.lm_head"] == 0
    two = size_report(config, pp=2)
    assert two.stages[1].params["text.lm_head"] == padded_vocab(151936) * 2048  # the last stage's copy of the table


def test_padded_vocabulary_values() -> None:
    """The report pads with the backend's own function (actors/megatron/shard.py): the figures it gives here."""
    assert [padded_vocab(151936, tp) for tp in (1, 2, 3, 8)] == [151936, 151936, 152064, 151936]
    assert padded_vocab(8448, 3) == 8448 and padded_vocab(1000) == 1024


def test_kv_cache_heads_split_and_replicated() -> None:
    text = SimpleNamespace(num_key_value_heads=4, num_hidden_layers=28, hidden_size=3584, num_attention_heads=28)
    assert kv_cache_bytes_per_token(text, "bfloat16", 1) == (2 * 28 * 4 * 128 * 2, 4)
    assert kv_cache_bytes_per_token(text, "bfloat16", 2) == (2 * 28 * 2 * 128 * 2, 2)
    assert kv_cache_bytes_per_token(text, "bfloat16", 8) == (2 * 28 * 1 * 128 * 2, 1)  # one head copied per rank
    assert kv_cache_bytes_per_token(text, "float32", 1)[0] == 2 * 28 * 4 * 128 * 4


def test_plain_optimizer_and_fp32() -> None:
    plain = size_report("qwen2.5-omni-3b", optimizer="plain")
    n = plain.largest.total_params
    assert (plain.largest.master, plain.largest.moments) == (0, n * 4)  # AdamW moments in bf16, no master copy
    fp32 = size_report("qwen2.5-omni-3b", dtype="float32")
    assert (fp32.largest.weights, fp32.largest.master, fp32.largest.moments) == (n * 4, 0, n * 8)


@pytest.mark.parametrize(("name", "kwargs", "field"), [
    ("qwen2.5-omni-3b", {"tp": 4}, "num_key_value_heads=2 is not a multiple of tp"),  # 16 heads split, 2 groups not
    ("qwen2.5-omni-7b", {"tp": 8}, "num_attention_heads=28 is not a multiple of tp"),
    ("qwen2.5-omni-7b", {"pp": 3}, "num_hidden_layers=28 is not a multiple of pp"),
    ("qwen2.5-omni-7b", {"ep": 2, "dp": 2}, "num_experts is 0"),
    ("qwen2.5-omni-7b", {"dtype": "int8"}, "dtype='int8'"),
])
def test_layouts_megatron_refuses(name: str, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        size_report(name, **kwargs)


def test_ep_must_divide_dp() -> None:
    with pytest.raises(ValueError, match="must divide dp"):
        size_report("qwen3-omni-30b-a3b", ep=4, dp=2)


def test_sources_dict_thinker_dir_and_file(tmp_path: Path) -> None:
    full = published_config("qwen2.5-omni-3b")
    (tmp_path / "config.json").write_text(json.dumps(full))
    by_name = size_report("qwen2.5-omni-3b")
    assert size_report(full).parts == size_report(tmp_path).parts == size_report(tmp_path / "config.json").parts \
        == by_name.parts
    thinker = size_report(full["thinker_config"])  # a thinker saved on its own: no talker, no vocoder
    assert thinker.parts == by_name.parts and thinker.untrained == {}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty/config.json: missing"):
        size_report(empty)
    with pytest.raises(FileNotFoundError, match="published model name"):
        size_report("no-such-model")
    with pytest.raises(ValueError, match="model_type='llama'"):
        size_report({"model_type": "llama"})


def test_report_fits_one_screen() -> None:
    for r in (size_report("qwen3-omni-30b-a3b", tp=2, pp=2, ep=2, dp=2, distributed_optimizer=True),
              size_report("qwen2.5-omni-7b", tp=2)):
        lines = format_report(r).splitlines()
        assert len(lines) <= 40 and max(map(len, lines)) <= 120
        assert any(x.startswith("  talker (not trained)") for x in lines)
        assert any(x.startswith("  total ") for x in lines)


# -- the check: stand-ins' measured sizes scaled by depth ----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _shapes(name: str, layers: int, thinker_only: bool) -> dict[str, tuple[int, ...]]:
    return published_tensor_shapes(name, layers, thinker_only=thinker_only)  # ~1 s: the meta model at that depth


def _write_headers_only(directory: Path, name: str, layers: int, *, thinker_only: bool = False, shards: int = 2) -> Path:
    """A stand-in directory as write_standin lays it out (its config.json, the published tensor names and shapes,
    sharded safetensors + index), with sparse all-zero tensor data: valid safetensors files that cost no disk or
    time at real widths. (write_standin itself would write GBs of random weights at these widths.)"""
    shapes = _shapes(name, layers, thinker_only)
    config = published_config(name, layers)
    if thinker_only:
        config = config["thinker_config"]
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    names = list(shapes)
    weight_map = {}
    for k in range(shards):
        group = names[k * len(names) // shards:(k + 1) * len(names) // shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for n in group:
            size = math.prod(shapes[n]) * 2
            header[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[n] = file
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with (directory / file).open("wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # a hole: no bytes written
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.mark.parametrize(("name", "layers", "thinker_only"), [
    ("qwen2.5-omni-3b", 1, False), ("qwen3-omni-30b-a3b", 1, False),  # the published layout: thinker.*, talker.*, ...
    ("qwen2.5-omni-7b", 2, True), ("qwen3-omni-30b-a3b", 2, True),  # a thinker saved on its own; two deepstack mergers
])
def test_standin_scaled_by_depth_predicts_the_report(tmp_path: Path, name: str, layers: int,
                                                     thinker_only: bool) -> None:
    standin = _write_headers_only(tmp_path / "standin", name, layers, thinker_only=thinker_only)
    predicted = predict_from_standin(standin, name)
    assert predicted == size_report(name).parts
    shapes = measure_checkpoint(standin)
    assert any(n.startswith("talker.") for n in shapes) != thinker_only  # the talker is there and not counted
    measured = sum(math.prod(s) for n, s in shapes.items() if thinker_only or n.startswith("thinker."))
    assert measured < sum(predicted.values()) / 4  # the prediction really scales


def test_header_reader_agrees_with_safetensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    standin = _write_headers_only(tmp_path / "s", "qwen2.5-omni-3b", 1)
    shapes = measure_checkpoint(standin)
    index = json.loads((standin / INDEX_FILE).read_text())["weight_map"]
    file = next(iter(index.values()))
    with safe_open(str(standin / file), "pt") as f:
        for key in f.keys():
            assert tuple(f.get_slice(key).get_shape()) == shapes[key]


def test_standin_whose_config_disagrees_with_its_files(tmp_path: Path) -> None:
    standin = _write_headers_only(tmp_path / "s", "qwen2.5-omni-3b", 1)
    config = json.loads((standin / "config.json").read_text())
    config["thinker_config"]["text_config"]["num_hidden_layers"] = 2
    (standin / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json: says 2 text items"):
        predict_from_standin(standin, "qwen2.5-omni-3b")
    index = json.loads((standin / INDEX_FILE).read_text())
    (standin / next(iter(index["weight_map"].values()))).unlink()
    with pytest.raises(FileNotFoundError, match="safetensors: missing"):
        measure_checkpoint(standin)


def test_report_counts_what_the_megatron_backend_holds() -> None:
    """The one-process megatron actor's parameters (vocabulary padded to 128, fused qkv, towers) are the report's
    rank at TP1. (Checked by hand at TP2, PP2 with and without tied embeddings, EP2 and TP2 x EP2 with real rank
    groups of small thinkers: the same figures as the report, rank by rank.)"""
    from relax_gym.trainer.actors.megatron.actor import MegatronActor
    from relax_gym.trainer.policy import build_policy

    model, processor = build_policy()
    report = size_report(model.config.to_dict())
    assert report.trained == sum(p.numel() for p in model.parameters())
    actor = MegatronActor(model, processor, lr=1e-3)
    try:
        assert sum(p.numel() for p in actor.model.parameters()) == report.largest.total_params > report.trained
    finally:
        actor.close()
