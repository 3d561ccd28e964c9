"""The in-code tokenizer: special tokens, round trips, chat template, determinism, save/load."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from relax_gym.trainer.policy.tokenizer import MEDIA_TOKENS, SPECIAL_TOKENS, TAG_TOKENS, build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_special_and_tag_tokens_are_single_ids_in_fixed_order(tok):
    for i, token in enumerate((*SPECIAL_TOKENS, *TAG_TOKENS)):
        assert tok.encode(token, add_special_tokens=False) == [i], token
        assert tok.convert_ids_to_tokens(i) == token
    # glued to text, they still come out whole
    ids = tok.encode("x<think>y</think><answer>B</answer><|im_end|>", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["x", "<think>", "y", "</think>", "<answer>", "B", "</answer>", "<|im_end|>"]


def test_qwen2_5_omni_names_and_roles(tok):
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 0)
    for attr, token in MEDIA_TOKENS.items():  # what Qwen2_5OmniProcessor reads off its tokenizer
        assert getattr(tok, attr) == token
        assert getattr(tok, f"{attr}_id") == tok.convert_tokens_to_ids(token)
    assert 300 <= len(tok) <= 2048


@pytest.mark.parametrize("text", [
    "which way does the red square move\nOptions:\nA. left\nB. up",
    '<think>The square is near (139, 21).</think><tool_call>{"name": "zoom", "arguments": {"x": 129, "y": 11, "w": 26, "h": 26}}</tool_call>',
    "<tool_response>\n1586193280\n</tool_response>",
    "Unseen wörds, émojis 🎲 and tabs\tstill round-trip;  double  spaces too.\n\n",
    "",
])
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_digits_are_split_and_decoding_keeps_tags(tok):
    ids = tok.encode("1586193280", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == list("1586193280")
    action = "<think>I will compute it.</think><answer>42</answer>"
    ids = tok.encode(action + "<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == action  # tags are text the envs parse, <|im_end|> is not


def test_chat_template_renders_chatml_with_media_placeholders(tok):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "video"}, {"type": "image"}, {"type": "audio"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<tool_call>{}</tool_call>"}]},
        {"role": "tool", "content": [{"type": "text", "text": "<tool_response>\n"}, {"type": "image"}, {"type": "text", "text": "\n</tool_response>"}]},
    ]
    text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_bos|><|VIDEO|><|vision_eos|><|vision_bos|><|IMAGE|><|vision_eos|>"
        "<|audio_bos|><|AUDIO|><|audio_eos|>What?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n<|vision_bos|><|IMAGE|><|vision_eos|>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    assert text == without + "<|im_start|>assistant\n"


def test_save_and_load_gives_the_same_tokenizer(tok, tmp_path):
    tok.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = '<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|>How many?<|im_end|>\n<think>x</think>{"a": 12}'
    assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert loaded.chat_template == tok.chat_template
    assert (loaded.image_token_id, loaded.eos_token_id, loaded.pad_token_id, loaded.bos_token) == (tok.image_token_id, 2, 0, None)
    assert len(loaded) == len(tok)


def test_training_is_deterministic_across_processes(tok):
    """BPE training sees hash maps; the result must still be the same file in another process."""
    code = ("import hashlib; from relax_gym.trainer.policy.tokenizer import build_tokenizer; "
            "print(hashlib.sha256(build_tokenizer().backend_tokenizer.to_str().encode()).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    here = hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()
    assert other.stdout.strip().splitlines()[-1] == here


def test_stored_corpus_is_what_the_environments_say():
    """The tokenizer trains on a stored corpus (the policy never imports the environments); it must still be what
    the built-in environments and their gold policies say, or the tokenizer silently drifts from them."""
    from relax_gym.trainer.policy.tokenizer import stored_conversations
    from relax_gym.trainer.tools.tokenizer_corpus import env_conversations

    stored = stored_conversations()
    assert len(stored) == 128 and any("<tool_response>" in t for t in stored) and any("<|VIDEO|>" in t for t in stored)
    assert stored == list(env_conversations()), (
        "the environments' text changed: run python -m relax_gym.trainer.tools.tokenizer_corpus "
        "and bump TOKENIZER_VERSION")


def test_a_damaged_corpus_file_names_itself(tmp_path):
    import gzip

    from relax_gym.trainer.policy.tokenizer import stored_conversations

    bad = tmp_path / "corpus.json.gz"
    bad.write_bytes(gzip.compress(b'{"not": "a list"}'))
    with pytest.raises(ValueError, match="corpus.json.gz: expected a JSON list of strings"):
        stored_conversations(bad)
