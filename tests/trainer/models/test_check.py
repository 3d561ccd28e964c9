"""``relax-gym model check``: the report of a published-layout directory on one screen, and one line naming the culprit
for a broken one (missing shard, wrong vocabulary size, missing tokenizer file: the issue's acceptance points)."""

from __future__ import annotations

import json

import pytest

from relax_gym.trainer.models.check import WIDTH, check_directory, format_check
from relax_gym.trainer.models.published import PUBLISHED
from relax_gym.trainer.policy.model import PolicyConfig, build_policy, save_policy
from tests.trainer.policy.test_checkpoint_dirs import INDEX, _set, linked_copy


@pytest.fixture(scope="module")
def report_3b(standin_3b):
    return check_directory(standin_3b)


def test_report_of_the_3b_standin(report_3b, standin_3b):
    r = report_3b
    assert r.ok and r.error is None, r.error
    assert r.architecture == {"model_type": "qwen2_5_omni", "family": "qwen2_5_omni", "layout": "full",
                              "thinker_class": "Qwen2_5OmniThinkerForConditionalGeneration", "talker": True,
                              "skipped": r.architecture["skipped"]}
    assert set(r.architecture["skipped"]) == {"talker", "token2wav"}
    assert {k: r.text[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "head_dim", "vocab_size", "intermediate_size")} == {
        "hidden_size": 2048, "num_hidden_layers": 1, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 128, "vocab_size": 151936, "intermediate_size": 11008}
    assert (r.vision["depth"], r.vision["hidden_size"], r.vision["patch_size"]) == (2, 1280, 14)
    assert (r.audio["encoder_layers"], r.audio["d_model"], r.audio["num_mel_bins"]) == (1, 1280, 128)
    assert r.dtype["config"] == "bfloat16" and set(r.dtype["thinker_weights"]) == {"bfloat16"}
    index = json.loads((standin_3b / INDEX).read_text())["weight_map"]
    assert r.weights["shards"] == 3 and r.weights["thinker_tensors"] == sum(k.startswith("thinker.") for k in index)
    assert r.weights["bytes"] == sum((standin_3b / s).stat().st_size for s in set(index.values()))
    assert r.tokenizer["size"] == 151665 and r.tokenizer["eos"] == ("<|im_end|>", 151645)
    assert r.tokenizer["pad"] == ("<|endoftext|>", 151643)
    assert r.tokenizer["added_tokens"] == [(t, i) for t, i, _ in PUBLISHED["qwen2.5-omni-3b"].special_tokens]
    assert r.tokenizer["media_tokens"]["image_token"] == ("<|IMAGE|>", 151655)
    assert r.template == {"present": True, "source": "chat_template.json", "append_only": True}
    assert (r.media["image_min_pixels"], r.media["image_max_pixels"]) == (3136, 12845056)
    assert (r.media["video_min_pixels"], r.media["video_max_pixels"], r.media["video_fps"]) == (100352, 602112, 2.0)
    assert (r.media["audio_sampling_rate"], r.media["audio_mel_bins"], r.media["audio_chunk_seconds"]) == (16000, 128, 300)
    assert r.load == {"meta": True}
    text = format_check(r)
    lines = text.splitlines()
    assert lines[0] == str(standin_3b) and lines[-1] == "OK"
    assert len(lines) <= 40 and max(len(line) for line in lines) <= WIDTH  # one screen
    for needle in ("qwen2_5_omni (full layout); thinker Qwen2_5OmniThinkerForConditionalGeneration", "talker present",
                   "hidden 2048, layers 1, heads 16 / kv 2, head_dim 128", "vocab 151936", "config bfloat16",
                   "3 shard(s)", "Qwen2Tokenizer, 151665 tokens", "image <|IMAGE|>=151655", "<|im_start|>=151644",
                   "append-only: yes", "min_pixels 3136, max_pixels 12845056",
                   "min_pixels 100352, max_pixels 602112, fps 2", "16000 Hz, 128 mel bins, chunk 300 s"):
        assert needle in text, needle


# the acceptance cases: (case, drop, edit, culprit file, field / what the line names)
BROKEN = [
    ("missing-shard", ("model-00003-of-00003.safetensors",), {}, INDEX,
     "weight_map: shard model-00003-of-00003.safetensors"),
    ("wrong-vocabulary-size", (), {"config.json": _set("thinker_config.text_config.vocab_size", 151665)},
     "config.json", "thinker_config.text_config.vocab_size is 151665 but"),
    ("missing-tokenizer-file", ("tokenizer.json", "merges.txt"), {}, "merges.txt", "missing: vocab.json without merges.txt"),
]


@pytest.mark.parametrize("case,drop,edit,culprit,says", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_directory_is_one_line_naming_the_culprit(standin_3b, tmp_path, case, drop, edit, culprit, says):
    directory = linked_copy(standin_3b, tmp_path / case, drop=drop, edit=edit)
    report = check_directory(directory)
    assert not report.ok and "\n" not in report.error
    assert report.error.startswith(f"{directory / culprit}: {says}"), report.error
    last = format_check(report).splitlines()[-1]
    assert last == f"error: {report.error}"
    assert report.architecture["model_type"] == "qwen2_5_omni"  # what was read before the failure is still shown


def test_load_loads_for_real_and_flags_a_template_that_is_not_append_only(tmp_path):
    model, processor = build_policy(PolicyConfig(dtype="bfloat16"))
    out = save_policy(model, processor.with_chat_template(PUBLISHED["qwen3-omni-30b-a3b"].chat_template), tmp_path / "p")
    report = check_directory(out, load=True)
    assert report.ok, report.error
    assert report.architecture["layout"] == "thinker" and report.architecture["talker"] is False
    assert report.load["loaded"] and report.load["dtype"] == "bfloat16"
    assert report.load["bytes"] == sum(p.numel() * 2 for p in model.parameters())
    assert report.template["append_only"] is False and "not append-only" in report.template["detail"]
    text = format_check(report)
    assert "append-only: NO" in text and "loaded for real" in text and text.endswith("\nOK")
    assert any("not append-only" in w for w in report.warnings)
