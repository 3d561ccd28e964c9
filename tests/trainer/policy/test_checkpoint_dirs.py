"""Checkpoint directories as users bring them: the published Qwen-Omni layout loads through ``model.path``, a broken
one fails with one line naming the file and the field, and what we save keeps the dtype and the published formats.

Real widths: the session's Qwen2.5-Omni-3B stand-in (``standin_3b``: full Omni config, three shards, ``thinker.``
keys, Qwen's tokenizer files; one layer per stack, bf16), loaded once per module. Broken directories are symlink
copies of it with one file dropped or edited (no weights copied). The Qwen3-Omni layout and the cases that need
weights rewritten use the tiny in-code thinkers wrapped in the full-Omni layout."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.models.published import PUBLISHED
from relax_gym.trainer.policy import model as policy_model
from relax_gym.trainer.policy.checkpoint_files import CheckpointDirError, MissingCheckpointFile
from relax_gym.trainer.policy.model import PolicyConfig, build_policy, save_policy
from relax_gym.trainer.policy.processor import VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS

INDEX = "model.safetensors.index.json"


# -- helpers --------------------------------------------------------------------------------------------------------

def linked_copy(src: Path, dst: Path, *, drop: tuple[str, ...] = (),
                edit: dict[str, Callable[[dict[str, Any]], None]] | None = None) -> Path:
    """``dst`` holding symlinks to ``src``'s files, except ``drop`` (left out) and ``edit`` (JSON files rewritten
    by the given function)."""
    dst.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.name in drop:
            continue
        if edit and f.name in edit:
            data = json.loads(f.read_text())
            edit[f.name](data)
            (dst / f.name).write_text(json.dumps(data))
        else:
            (dst / f.name).symlink_to(f)
    return dst


def broken(build: Callable[[], Any]) -> str:
    """The error ``build`` raises: a CheckpointDirError of one line."""
    with pytest.raises(CheckpointDirError) as info:
        build()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def header_dtypes(directory: Path) -> set[str]:
    out = set()
    for shard in directory.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            out |= {f.get_slice(k).get_dtype() for k in f.keys()}
    return out


def full_omni_dir(model, processor, out: Path, model_type: str, *, other: tuple[str, ...]) -> Path:
    """A tiny thinker in the published full-Omni layout: config.json with thinker_config, the thinker's tensors
    (published names, as save_pretrained writes them) under ``thinker.`` in two shards plus an index, one tensor of
    each other part (talker, vocoder)."""
    flat = save_policy(model, processor, out.with_name(out.name + "-thinker"))
    processor.save_pretrained(out)
    tensors = {f"thinker.{k}": v for k, v in load_file(str(flat / "model.safetensors")).items()}
    for part in other:
        tensors[f"{part}.proj.weight"] = torch.zeros(2, 2)
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in halves.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(out / shard), metadata={"format": "pt"})
    (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {k: s for s, ks in halves.items() for k in ks}}))
    (out / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["OmniModel"],
                                                 "thinker_config": model.config.to_dict(), "torch_dtype": "float32"}))
    return out


def _logits(model, processor, env: str = "echo-ink"):
    obs, _ = relax_gym.make(env).reset(seed=0)
    batch = processor.collate([render(obs, processor)], padding_side="left")
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "loss_mask"}).logits


# -- the 3B stand-in at real widths -----------------------------------------------------------------------------------

class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def loaded_3b(standin_3b):
    """The stand-in through ``build_policy``, with what the first load of it in this process logged."""
    logger, collect = logging.getLogger(policy_model.__name__), _Collect()
    logger.addHandler(collect)
    announced, policy_model._announced = policy_model._announced, set()
    try:
        model, processor = build_policy(PolicyConfig(path=str(standin_3b)))
    finally:
        logger.removeHandler(collect)
        policy_model._announced |= announced
    return model, processor, collect.messages


def test_full_omni_3b_loads_the_thinker_in_the_checkpoint_dtype(loaded_3b, standin_3b):
    model, processor, messages = loaded_3b
    assert type(model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # model.dtype auto: the checkpoint's
    text = model.config.text_config
    assert (text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.vocab_size) == (2048, 16, 2, 151936)
    assert model.model.language_model.embed_tokens.weight.shape == (151936, 2048)
    # the checkpoint's tokenizer, chat template and preprocessor limits
    assert len(processor.tokenizer) == 151665 and processor.image_token_id == 151655 and processor.eos_token_id == 151645
    assert processor.chat_template == PUBLISHED["qwen2.5-omni-3b"].chat_template
    assert (processor.min_pixels, processor.max_pixels, processor.patch_size) == (3136, 12845056, 14)
    assert processor.feature_extractor.chunk_length == 300 and processor.processor_class == "Qwen2_5OmniProcessor"
    # no video config in the published directory: the published video defaults, not the image limits
    assert (processor.video_min_pixels, processor.video_max_pixels, processor.default_video_fps) == (100352, 602112, 2.0)
    assert (VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS) == (128 * 28 * 28, 768 * 28 * 28)
    # talker and vocoder said once, with their tensor counts from the index
    index = json.loads((standin_3b / INDEX).read_text())["weight_map"]
    talker = sum(k.startswith("talker.") for k in index)
    vocoder = sum(k.startswith("token2wav.") for k in index)
    assert talker > 0 and vocoder > 0
    said = [m for m in messages if "skipping" in m]
    assert len(said) == 1, messages
    assert f"talker ({talker} tensors)" in said[0] and f"token2wav ({vocoder} tensors)" in said[0]
    logger, collect = logging.getLogger(policy_model.__name__), _Collect()
    logger.addHandler(collect)
    try:
        policy_model._announce_skipped(policy_model.read_checkpoint_dir(standin_3b))
    finally:
        logger.removeHandler(collect)
    assert collect.messages == []  # once per process


def test_saved_checkpoint_keeps_bf16_and_the_published_formats(loaded_3b, standin_3b, tmp_path):
    from transformers import (AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer,
                              Qwen2_5OmniThinkerForConditionalGeneration)
    from transformers.video_processing_utils import BaseVideoProcessor

    model, processor, _ = loaded_3b
    out = save_policy(model, processor, tmp_path / "saved")
    assert header_dtypes(out) == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    # preprocessor_config.json: the published file, key for key and spelling for spelling
    assert json.loads((out / "preprocessor_config.json").read_text()) == PUBLISHED["qwen2.5-omni-3b"].preprocessor
    video = json.loads((out / "video_preprocessor_config.json").read_text())
    assert video["size"] == {"shortest_edge": 100352, "longest_edge": 602112} and video["fps"] == 2.0
    # what a transformers user reads back
    tokenizer = AutoTokenizer.from_pretrained(out)
    sample = "<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|>hi<|im_end|>\n"
    assert len(tokenizer) == 151665 and tokenizer.encode(sample) == processor.tokenizer.encode(sample)
    assert tokenizer.chat_template == PUBLISHED["qwen2.5-omni-3b"].chat_template
    image = AutoImageProcessor.from_pretrained(out)
    assert type(image).__name__.startswith("Qwen2VLImageProcessor")
    assert (image.size["shortest_edge"], image.size["longest_edge"], image.patch_size, image.merge_size) == (3136, 12845056, 14, 2)
    audio = AutoFeatureExtractor.from_pretrained(out)
    assert (type(audio).__name__, audio.feature_size, audio.chunk_length, audio.n_samples) == ("WhisperFeatureExtractor", 128, 300, 4_800_000)
    # the video processor class needs torchvision (not installable beside our CPU torch): its config reader runs
    video_dict, _ = BaseVideoProcessor.get_video_processor_dict(str(out))
    assert video_dict["size"] == {"shortest_edge": 100352, "longest_edge": 602112}
    assert video_dict["video_processor_type"] == "Qwen2VLVideoProcessor"
    thinker, info = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(out, dtype="auto", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert next(thinker.parameters()).dtype == torch.bfloat16
    for name in ("model.language_model.embed_tokens.weight", "lm_head.weight",
                 "model.language_model.layers.0.self_attn.k_proj.weight", "model.visual.blocks.1.attn.q.weight",
                 "model.audio_tower.layers.0.fc1.weight"):
        assert torch.equal(thinker.get_parameter(name), model.get_parameter(name)), name
    del thinker
    # and our own loader reads the thinker-only layout back
    again, again_processor = build_policy(PolicyConfig(path=str(out)))
    assert again_processor.to_dict() == processor.to_dict()
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        for key in parents:
            data = data[key]
        data[leaf] = value
    return edit


def _move_tensor(data: dict[str, Any]) -> None:
    weight_map = data["weight_map"]
    key = next(k for k, v in sorted(weight_map.items()) if v == "model-00001-of-00003.safetensors")
    weight_map[key] = "model-00003-of-00003.safetensors"


def _drop_tensor(data: dict[str, Any]) -> None:
    del data["weight_map"]["thinker.model.layers.0.mlp.down_proj.weight"]


# (case, build kwargs, drop, edit, culprit file, what the message must say)
BROKEN = [
    ("no-config", {}, ("config.json",), {}, "config.json", ["missing", "not a model checkpoint directory"]),
    ("missing-shard", {}, ("model-00002-of-00003.safetensors",), {}, INDEX,
     ["weight_map", "shard model-00002-of-00003.safetensors", "is not in the directory"]),
    ("index-names-absent-tensor", {}, (), {INDEX: _move_tensor}, INDEX,
     ["weight_map", "is placed in model-00003-of-00003.safetensors, which holds no such tensor"]),
    ("missing-tensor", {}, (), {INDEX: _drop_tensor}, INDEX,
     ["no tensor for 1 parameter(s) thinker_config.text_config", "thinker.model.layers.0.mlp.down_proj.weight", "random"]),
    ("vocab", {}, (), {"config.json": _set("thinker_config.text_config.vocab_size", 152064)}, "config.json",
     ["thinker_config.text_config.vocab_size is 152064", "thinker.model.embed_tokens.weight has 151936 rows"]),
    ("hidden", {}, (), {"config.json": _set("thinker_config.text_config.hidden_size", 3584)}, "config.json",
     ["thinker_config.text_config.hidden_size is 3584", "is 2048 wide"]),
    ("layers", {}, (), {"config.json": _set("thinker_config.text_config.num_hidden_layers", 2)}, "config.json",
     ["thinker_config.text_config.num_hidden_layers is 2 but the weights hold 1 decoder layer(s) (index 0)"]),
    ("vision-depth", {}, (), {"config.json": _set("thinker_config.vision_config.depth", 4)}, "config.json",
     ["thinker_config.vision_config.depth is 4 but the weights hold 2 vision block(s) (indices 0..1)"]),
    ("kv-heads", {}, (), {"config.json": _set("thinker_config.text_config.num_key_value_heads", 4)}, "config.json",
     ["thinker_config.text_config gives model.language_model.layers.0.self_attn.k_proj.bias the shape [512]",
      "thinker.model.layers.0.self_attn.k_proj.bias is [256]"]),
    ("family", {"family": "qwen3_omni_moe"}, (), {}, "config.json",
     ["model_type: 'qwen2_5_omni' is a qwen2_5_omni checkpoint but model.family is 'qwen3_omni_moe'",
      "set model.family=qwen2_5_omni"]),
    ("no-tokenizer", {}, ("tokenizer.json", "vocab.json", "merges.txt"), {}, "tokenizer.json",
     ["missing", "no tokenizer"]),
    ("no-merges", {}, ("tokenizer.json", "merges.txt"), {}, "merges.txt", ["missing", "vocab.json without merges.txt"]),
    ("no-tokenizer-config", {}, ("tokenizer_config.json",), {}, "tokenizer_config.json", ["missing"]),
    ("media-token-id", {}, (), {"config.json": _set("thinker_config.image_token_index", 151654)}, "config.json",
     ["thinker_config.image_token_index is 151654", "'<|IMAGE|>' the id 151655"]),
    ("preprocessor-patch", {}, (), {"preprocessor_config.json": _set("patch_size", 16)}, "preprocessor_config.json",
     ["patch_size is 16", "thinker_config.vision_config.patch_size is 14"]),
    ("no-preprocessor", {}, ("preprocessor_config.json",), {}, "preprocessor_config.json", ["missing"]),
]


@pytest.mark.parametrize("case,kwargs,drop,edit,culprit,says", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_directory_fails_with_one_line_naming_file_and_field(standin_3b, tmp_path, case, kwargs, drop, edit,
                                                                    culprit, says):
    directory = linked_copy(standin_3b, tmp_path / case, drop=drop, edit=edit)
    message = broken(lambda: build_policy(PolicyConfig(path=str(directory), **kwargs)))
    assert message.startswith(f"{directory / culprit}: "), message
    for text in says:
        assert text in message, (text, message)


def test_missing_files_are_file_not_found_errors(standin_3b, tmp_path):
    directory = linked_copy(standin_3b, tmp_path / "d", drop=("model-00001-of-00003.safetensors",))
    with pytest.raises(FileNotFoundError):
        build_policy(PolicyConfig(path=str(directory)))
    with pytest.raises(MissingCheckpointFile):
        build_policy(PolicyConfig(path=str(tmp_path / "nowhere")))


def test_unreadable_or_foreign_weight_files(standin_3b, tmp_path):
    cut = linked_copy(standin_3b, tmp_path / "cut", drop=("model-00003-of-00003.safetensors",))
    (cut / "model-00003-of-00003.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    message = broken(lambda: build_policy(PolicyConfig(path=str(cut))))
    assert message.startswith(f"{cut / 'model-00003-of-00003.safetensors'}: not a readable safetensors file")
    torch_bin = linked_copy(standin_3b, tmp_path / "bin", drop=(INDEX, "model-00001-of-00003.safetensors",
                                                             "model-00002-of-00003.safetensors",
                                                             "model-00003-of-00003.safetensors"))
    (torch_bin / "pytorch_model.bin").write_bytes(b"")
    assert broken(lambda: build_policy(PolicyConfig(path=str(torch_bin)))).startswith(
        f"{torch_bin / 'pytorch_model.bin'}: relax-gym reads safetensors weights only")


def test_a_missing_media_token_is_named(standin_3b, tmp_path):
    """The vocabulary lacks ``<|IMAGE|>`` and tokenizer_config.json names no other image token."""
    directory = linked_copy(standin_3b, tmp_path / "d", drop=("vocab.json", "merges.txt"))
    for name, edit in (("tokenizer.json", lambda d: d.update(added_tokens=[t for t in d["added_tokens"] if t["content"] != "<|IMAGE|>"])),
                       ("tokenizer_config.json", lambda d: (d["extra_special_tokens"].pop("image_token"),
                                                            d.get("added_tokens_decoder", {}).pop("151655", None)))):
        data = json.loads((directory / name).read_text())
        edit(data)
        (directory / name).unlink()
        (directory / name).write_text(json.dumps(data))
    message = broken(lambda: build_policy(PolicyConfig(path=str(directory))))
    assert message.startswith(f"{directory / 'tokenizer.json'}: no single token '<|IMAGE|>' (image_token")


# -- tiny thinkers: the Qwen3-Omni layout, rewritten weights, dtypes, processor files --------------------------------

@pytest.fixture(scope="module")
def tiny_moe():
    return build_policy(PolicyConfig(family="qwen3_omni_moe"))


def test_qwen3_omni_full_layout_loads_the_moe_thinker(tiny_moe, tmp_path, caplog):
    model, processor = tiny_moe
    directory = full_omni_dir(model, processor, tmp_path / "q3", "qwen3_omni_moe", other=("talker", "code2wav"))
    with caplog.at_level(logging.WARNING, logger=policy_model.__name__):
        loaded, loaded_processor = build_policy(PolicyConfig(path=str(directory), family="qwen3_omni_moe"))
    assert type(loaded).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration"
    assert loaded_processor.audio_token_rule == "qwen3_omni" and loaded_processor.processor_class == "Qwen3OmniMoeProcessor"
    assert torch.equal(_logits(model, processor), _logits(loaded, loaded_processor))
    said = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(said) == 1 and "code2wav (1 tensors)" in said[0] and "talker (1 tensors)" in said[0]
    # the family is not guessed: a qwen3_omni_moe directory with the default family says what to set
    message = broken(lambda: build_policy(PolicyConfig(path=str(directory))))
    assert message == (f"{directory / 'config.json'}: model_type: 'qwen3_omni_moe' is a qwen3_omni_moe checkpoint but "
                       "model.family is 'qwen2_5_omni'; set model.family=qwen3_omni_moe")


def test_expert_count_must_match_the_config(tiny_moe, tmp_path):
    model, processor = tiny_moe
    directory = full_omni_dir(model, processor, tmp_path / "q3", "qwen3_omni_moe", other=("talker",))
    index = json.loads((directory / INDEX).read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if ".mlp.experts.7." not in k}
    (directory / INDEX).write_text(json.dumps(index))
    message = broken(lambda: build_policy(PolicyConfig(path=str(directory), family="qwen3_omni_moe")))
    assert message.startswith(f"{directory / 'config.json'}: thinker_config.text_config.num_experts is 8 but the "
                              "weights hold 7 experts' ")


def test_tokenizer_larger_than_the_vocabulary(model, processor, tmp_path):
    out = save_policy(model, processor, tmp_path / "p")
    tokenizer = processor.tokenizer.__class__.from_pretrained(out)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(3)])
    tokenizer.save_pretrained(out)
    vocab = model.config.text_config.vocab_size
    message = broken(lambda: build_policy(PolicyConfig(path=str(out))))
    assert message == (f"{out / 'tokenizer.json'}: the tokenizer has {vocab + 3} tokens (added tokens included) but "
                       f"{out / 'config.json'} text_config.vocab_size is {vocab}: ids >= {vocab} have no embedding row")


def test_dtype_auto_keeps_the_checkpoint_dtype_and_others_cast(processor, tmp_path):
    bf16, bf16_processor = build_policy(PolicyConfig(dtype="bfloat16"))
    out = save_policy(bf16, bf16_processor, tmp_path / "bf16")
    assert header_dtypes(out) == {"BF16"} and json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert PolicyConfig(path=str(out)).torch_dtype == torch.bfloat16 and PolicyConfig().torch_dtype == torch.float32
    auto, _ = build_policy(PolicyConfig(path=str(out)))
    wide, _ = build_policy(PolicyConfig(path=str(out), dtype="float32"))
    assert next(auto.parameters()).dtype == torch.bfloat16 and next(wide.parameters()).dtype == torch.float32
    assert torch.equal(wide.lm_head.weight, bf16.lm_head.weight.float())
    assert torch.equal(auto.lm_head.weight, bf16.lm_head.weight)


def test_video_limits_come_from_the_video_config_or_the_published_defaults(model, processor, tmp_path):
    out = save_policy(model, processor, tmp_path / "p")
    saved = json.loads((out / "video_preprocessor_config.json").read_text())
    assert saved["size"] == {"shortest_edge": processor.video_min_pixels, "longest_edge": processor.video_max_pixels}
    saved["fps"] = 4.0
    (out / "video_preprocessor_config.json").write_text(json.dumps(saved))
    _, loaded = build_policy(PolicyConfig(path=str(out)))
    assert (loaded.video_min_pixels, loaded.video_max_pixels, loaded.default_video_fps) == (
        processor.video_min_pixels, processor.video_max_pixels, 4.0)
    (out / "video_preprocessor_config.json").unlink()
    _, defaults = build_policy(PolicyConfig(path=str(out)))
    assert (defaults.video_min_pixels, defaults.video_max_pixels, defaults.default_video_fps) == (100352, 602112, 2.0)
    assert defaults.max_pixels == processor.max_pixels != defaults.video_max_pixels


def test_an_older_relax_gym_preprocessor_file_still_loads(model, processor, tmp_path):
    """Directories saved before the published formats: everything in one preprocessor_config.json with
    processor_class OmniProcessor; read as before, written back in the published formats."""
    out = save_policy(model, processor, tmp_path / "old")
    (out / "video_preprocessor_config.json").unlink()
    old = {**processor.to_dict(), "processor_class": "OmniProcessor", "video_max_pixels": 48 * 48, "default_video_fps": 3.0}
    (out / "preprocessor_config.json").write_text(json.dumps(old))
    _, loaded = build_policy(PolicyConfig(path=str(out)))
    assert (loaded.video_max_pixels, loaded.default_video_fps, loaded.processor_class) == (48 * 48, 3.0, "Qwen2_5OmniProcessor")
    loaded.save_pretrained(tmp_path / "new")
    written = json.loads((tmp_path / "new" / "preprocessor_config.json").read_text())
    assert written["processor_class"] == "Qwen2_5OmniProcessor"
    assert not {"video_min_pixels", "video_max_pixels", "default_video_fps", "audio_token_rule"} & set(written)


def test_trainer_checkpoints_keep_the_dtype(tmp_path):
    """The hf actor's checkpoint of a bf16 policy: bf16 weights, bf16 optimizer state, loaded back exactly."""
    from relax_gym.trainer.actors.hf import HFActor
    from relax_gym.trainer.run.checkpoint import OPTIMIZER_FILE, TrainerState, save_checkpoint

    model, processor = build_policy(PolicyConfig(dtype="bfloat16"))
    actor = HFActor(model, processor, lr=1e-2)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    actor.optimizer.step()
    path = save_checkpoint(tmp_path / "run", actor, TrainerState(step=1, version=1, cursor={}, rng={}))
    assert header_dtypes(path) == {"BF16"}
    state = torch.load(path / OPTIMIZER_FILE, weights_only=True)["state"]
    assert {v["exp_avg"].dtype for v in state.values()} == {torch.bfloat16}
    fresh, _ = build_policy(PolicyConfig(dtype="bfloat16", seed=1))
    other = HFActor(fresh, processor, lr=1e-2)
    other.load_checkpoint(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_a_json_syntax_error_names_the_file_line_and_column(standin_3b, tmp_path):
    bad_config = linked_copy(standin_3b, tmp_path / "config", drop=("config.json",))
    (bad_config / "config.json").write_text('{"model_type": "qwen2_5_omni",\n "thinker_config": }')
    assert broken(lambda: build_policy(PolicyConfig(path=str(bad_config)))) == (
        f"{bad_config / 'config.json'}: is not valid JSON (line 2, column 20: Expecting value)")
    bad_video = linked_copy(standin_3b, tmp_path / "video")
    (bad_video / "video_preprocessor_config.json").write_text('{"size": {"shortest_edge": 3136,}}')
    assert broken(lambda: build_policy(PolicyConfig(path=str(bad_video)))).startswith(
        f"{bad_video / 'video_preprocessor_config.json'}: is not valid JSON (line 1")
