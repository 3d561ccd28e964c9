"""render / extend with the real processor and chat template on environment conversations."""

from __future__ import annotations

import re

import pytest
import torch

import relax_gym
from relax_gym.omni import Message, TextPart
from relax_gym.omni.render import TemplateNotAppendOnly, check_append_only, extend, render, to_template_dicts

# A Qwen3-style template that drops <think>…</think> from assistant turns before the last user message.
THINK_STRIPPING = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set t = namespace(s='') -%}"
    "{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'text' -%}{%- set t.s = t.s + p['text'] -%}"
    "{%- elif p['type'] == 'image' -%}{%- set t.s = t.s + '<|vision_bos|><|IMAGE|><|vision_eos|>' -%}"
    "{%- elif p['type'] == 'video' -%}{%- set t.s = t.s + '<|vision_bos|><|VIDEO|><|vision_eos|>' -%}"
    "{%- elif p['type'] == 'audio' -%}{%- set t.s = t.s + '<|audio_bos|><|AUDIO|><|audio_eos|>' -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in t.s -%}"
    "{%- set t.s = t.s.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + t.s + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _gold_ids(processor, text):
    return processor.encode_text(text) + [processor.eos_token_id]


def _zoom_episode(processor):
    """Play image-zoom with its gold policy, rendering turn by turn; returns (incremental render, history)."""
    env = relax_gym.make("image-zoom").unwrapped
    obs, info = env.reset(seed=4)
    rendered = render(obs, processor)
    done = False
    while not done:
        action = info["gold"]
        new, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        prev = rendered
        rendered = extend(prev, new, assistant_token_ids=_gold_ids(processor, action), add_generation_prompt=not done)
        assert rendered.input_ids[: len(prev)] == prev.input_ids
        for key, old in prev.mm.items():
            assert torch.equal(rendered.mm[key][: old.shape[0]], old)
    return rendered, list(env.history)


def test_extend_equals_fresh_render_on_a_tool_episode_with_images(processor):
    incremental, history = _zoom_episode(processor)
    fresh = render(history, processor, add_generation_prompt=False)
    assert incremental.input_ids == fresh.input_ids
    assert incremental.loss_mask == fresh.loss_mask
    assert incremental.num_media == fresh.num_media == {"image": 2, "video": 0, "audio": 0}
    assert fresh.mm.keys() == incremental.mm.keys() == {"pixel_values", "image_grid_thw"}
    for key in fresh.mm:
        assert torch.equal(incremental.mm[key], fresh.mm[key])
    assert fresh.input_ids.count(processor.image_token_id) == int(fresh.mm["image_grid_thw"].prod(-1).sum()) // 4
    template_text = processor.apply_chat_template(to_template_dicts(history))
    assert re.sub(r"(<\|IMAGE\|>)+", "<|IMAGE|>", processor.decode(incremental.input_ids)) == template_text


def test_loss_mask_on_a_two_turn_conversation(processor):
    env = relax_gym.make("image-zoom").unwrapped
    obs, info = env.reset(seed=1)
    first = info["gold"]
    new, _, _, _, info = env.step(first)
    second = info["gold"]
    conv = [*obs, Message("assistant", first), *new, Message("assistant", second)]
    r = render(conv, processor, add_generation_prompt=False)
    masked = [t for t, m in zip(r.input_ids, r.loss_mask) if m]
    assert processor.decode(masked) == f"{first}<|im_end|>{second}<|im_end|>"
    assert processor.tokenizer.decode([t for t, m in zip(r.input_ids, r.loss_mask) if not m]).count("<|im_start|>assistant\n") == 2
    assert not any(m for t, m in zip(r.input_ids, r.loss_mask) if t in processor.media_token_ids.values())


def test_append_only_check_on_env_conversations(processor):
    conversations = []
    for env_id in ("nextqa-video", "echo-ink", "tool-use"):
        obs, info = relax_gym.make(env_id).reset(seed=0)
        conversations.append([*obs, Message("assistant", info["gold"])])
    tool_turns = [*conversations[-1],
                  Message("tool", (TextPart("<tool_response>\n7\n</tool_response>"),), name="python"),
                  Message("user", "Give the final answer."),
                  Message("assistant", "<think>It printed 7.</think><answer>7</answer>")]
    conversations.append(tool_turns)
    assert check_append_only(processor, conversations) >= 10
    stripping = processor.with_chat_template(THINK_STRIPPING)
    with pytest.raises(TemplateNotAppendOnly, match=r"(?s)conversation 3, message 4 \(user\).*token \d+ on.*before: \[.*'<think>'"):
        check_append_only(stripping, conversations)
    with pytest.raises(TemplateNotAppendOnly):
        render(tool_turns, stripping)
