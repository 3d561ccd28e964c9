"""render / extend / check_append_only against a small duck-typed processor (characters are tokens), so the
rendering logic is tested without a model: loss mask, token-in-token-out extension, media order, template checks."""

from __future__ import annotations

import re
from types import SimpleNamespace

import jinja2
import numpy as np
import pytest
import torch

from relax_gym.omni import AudioPart, ImagePart, Message, TextPart
from relax_gym.omni.render import Rendered, TemplateNotAppendOnly, check_append_only, extend, render

CHATML = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}{%- else -%}"
    "{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'text' -%}{{- p['text'] -}}"
    "{%- elif p['type'] == 'image' -%}{{- '<|vision_bos|><|IMAGE|><|vision_eos|>' -}}"
    "{%- elif p['type'] == 'audio' -%}{{- '<|audio_bos|><|AUDIO|><|audio_eos|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Like some Qwen3 templates: assistant turns before the last user message lose their <think>…</think>.
THINK_STRIPPING = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set t = namespace(s='') -%}"
    "{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'text' -%}{%- set t.s = t.s + p['text'] -%}"
    "{%- elif p['type'] == 'image' -%}{%- set t.s = t.s + '<|vision_bos|><|IMAGE|><|vision_eos|>' -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in t.s -%}"
    "{%- set t.s = t.s.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + t.s + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class CharProcessor:
    """Duck-typed processor: special tokens are single ids, every other character is one token; an image
    takes (H*W)//256 tokens, an audio one token per 0.25 s."""

    SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_bos|>", "<|IMAGE|>", "<|vision_eos|>",
                "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>", "<think>", "</think>"]
    eos_token = "<|im_end|>"
    eos_token_id = 1
    media_token_ids = {"image": 3, "video": 99, "audio": 6}

    def __init__(self, template: str = CHATML) -> None:
        self.template = jinja2.Environment().from_string(template)
        self.split = re.compile("(" + "|".join(re.escape(s) for s in self.SPECIALS) + ")")

    def apply_chat_template(self, conversation, tokenize=False, add_generation_prompt=False):
        return self.template.render(messages=conversation, add_generation_prompt=add_generation_prompt)

    def encode_text(self, text):
        ids = []
        for piece in self.split.split(text):
            if piece in self.SPECIALS:
                ids.append(self.SPECIALS.index(piece))
            else:
                ids.extend(1000 + ord(c) for c in piece)
        return ids

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.SPECIALS[i] if i < len(self.SPECIALS) else chr(i - 1000) for i in ids)

    def encode_media(self, kind, data):
        if kind == "image":
            h, w, _ = data.shape
            n = (h * w) // 256
            return SimpleNamespace(token_ids=[3] * n, tensors={
                "pixel_values": torch.from_numpy(np.array(data[: n, 0, :], dtype=np.float32)),
                "image_grid_thw": torch.tensor([[1, h // 16, w // 16]])})
        n = max(1, len(data.waveform) * 4 // data.sample_rate)
        return SimpleNamespace(token_ids=[6] * n, tensors={"input_features": torch.from_numpy(np.array(data.waveform[None, :400]))})


def image(value: int, size: int = 32) -> ImagePart:
    return ImagePart.of(np.full((size, size, 3), value, np.uint8))


def tone(seconds: float) -> AudioPart:
    return AudioPart.of(np.linspace(-1, 1, int(16_000 * seconds), dtype=np.float32), rate_of_array=16_000)


def sampled(proc: CharProcessor, text: str) -> list[int]:
    return proc.encode_text(text) + [proc.eos_token_id]


def tool_episode() -> list[Message]:
    return [
        Message("system", "Use tools."),
        Message("user", (image(10), tone(1.0), TextPart("What colour?"))),
        Message("assistant", '<think>zoom</think><tool_call>{"name": "zoom"}</tool_call>'),
        Message("tool", (TextPart("<tool_response>\n"), image(200, 48), TextPart("\n</tool_response>"))),
        Message("assistant", "<tool_call>again</tool_call>"),
        Message("tool", (TextPart("<tool_response>\n"), image(90, 16), TextPart("\n</tool_response>"))),
        Message("user", "Answer now."),
        Message("assistant", "<think>red</think><answer>C</answer>"),
    ]


def assert_same(a: Rendered, b: Rendered) -> None:
    assert a.input_ids == b.input_ids
    assert a.loss_mask == b.loss_mask
    assert a.num_media == b.num_media
    assert a.mm.keys() == b.mm.keys()
    for key in a.mm:
        assert torch.equal(a.mm[key], b.mm[key]), key
    assert a.text == b.text


def test_loss_mask_covers_only_what_the_assistant_said():
    proc = CharProcessor()
    conv = [Message("system", "S"), Message("user", "Q1"), Message("assistant", "A1"),
            Message("user", "Q2"), Message("assistant", "<think>t</think>A2")]
    r = render(conv, proc, add_generation_prompt=False)
    assert proc.decode(r.input_ids) == proc.apply_chat_template([{"role": m.role, "content": m.text} for m in conv])
    masked = [i for i, m in zip(r.input_ids, r.loss_mask) if m]
    assert proc.decode(masked) == "A1<|im_end|><think>t</think>A2<|im_end|>"
    # exactly two runs, each right after "<|im_start|>assistant\n" and ending on <|im_end|>
    runs = [(s, e) for s, e in _runs(r.loss_mask)]
    assert len(runs) == 2
    for start, end in runs:
        assert proc.decode(r.input_ids[start - 11: start]) == "<|im_start|>assistant\n"
        assert r.loss_mask[start - 11: start] == [0] * 11
        assert r.input_ids[end - 1] == proc.eos_token_id
        assert r.input_ids[end] == proc.encode_text("\n")[0] and r.loss_mask[end] == 0
    assert r.num_loss_tokens == len(masked) and not r.generation_prompt


def _runs(mask):
    start = None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            yield start, i
            start = None


def test_extend_equals_a_fresh_render_token_for_token():
    proc = CharProcessor()
    episode = tool_episode()
    # turn by turn, as the trainer does it: opening, then (sampled ids, env messages) pairs
    r = render(episode[:2], proc)
    steps = [(2, [3]), (4, [5, 6]), (7, [])]
    for a, new in steps:
        prev = r
        last = new == []
        r = extend(prev, [episode[i] for i in new], assistant_token_ids=sampled(proc, episode[a].text), add_generation_prompt=not last)
        assert r.input_ids[: len(prev)] == prev.input_ids  # turn k+1 starts with turn k's exact ids ...
        assert r.loss_mask[: len(prev)] == prev.loss_mask
        for key, old in prev.mm.items():  # ... and its media tensors
            assert torch.equal(r.mm[key][: old.shape[0]], old)
    assert [m.text for m in r.messages] == [m.text for m in episode]
    fresh = render(episode, proc, add_generation_prompt=False)
    assert_same(r, fresh)
    assert fresh.num_media == {"image": 3, "video": 0, "audio": 1}
    assert fresh.mm["image_grid_thw"].tolist() == [[1, 2, 2], [1, 3, 3], [1, 1, 1]]  # conversation order


def test_sampled_ids_are_kept_verbatim_and_a_cut_turn_is_closed_unmasked():
    proc = CharProcessor()
    opening = render([Message("user", "Hi")], proc)
    odd = [1000 + ord("x"), 1000 + ord("y")]  # no end-of-turn: cut at the length limit
    r = extend(opening, [Message("user", "go on")], assistant_token_ids=odd)
    tail = r.input_ids[len(opening):]
    assert tail[:3] == [*odd, proc.eos_token_id]
    assert r.loss_mask[len(opening): len(opening) + 3] == [1, 1, 0]
    assert r.messages[1] == Message("assistant", "xy")  # decoded when no assistant message is given
    assert r.generation_prompt and proc.decode(r.input_ids).endswith("<|im_start|>assistant\n")
    # a row of a batched generate: pad ids after the end of turn are not part of the turn
    proc.pad_token_id = 0
    padded = extend(opening, [], assistant_token_ids=[*odd, proc.eos_token_id, 0, 0], add_generation_prompt=False)
    assert padded.input_ids[len(opening):] == [*odd, proc.eos_token_id, *proc.encode_text("\n")]
    with pytest.raises(ValueError, match="continue after the end-of-turn"):
        extend(opening, [], assistant_token_ids=[*odd, proc.eos_token_id, 1005])


def test_extend_needs_the_assistant_turn_after_a_generation_prompt():
    proc = CharProcessor()
    opening = render([Message("user", "Hi")], proc)
    with pytest.raises(ValueError, match="generation prompt"):
        extend(opening, [Message("user", "again")])
    closed = render([Message("user", "Hi")], proc, add_generation_prompt=False)
    with pytest.raises(ValueError, match="does not end with one"):
        extend(closed, [], assistant_token_ids=[1])
    # without a generation prompt, an assistant message is rendered from its text, header included
    r = extend(closed, [Message("assistant", "ok")], add_generation_prompt=False)
    assert_same(r, render([Message("user", "Hi"), Message("assistant", "ok")], proc, add_generation_prompt=False))


def test_append_only_check_passes_for_chatml_and_fails_loudly_for_think_stripping():
    conversations = [tool_episode(), [Message("user", "Q"), Message("assistant", "<think>a</think>B"),
                                      Message("user", "Q2"), Message("assistant", "C")]]
    assert check_append_only(CharProcessor(), conversations) > 0
    with pytest.raises(TemplateNotAppendOnly) as info:
        check_append_only(CharProcessor(THINK_STRIPPING), conversations)
    message = str(info.value)
    assert "conversation 0, message 6 (user)" in message
    assert "token" in message and "<think>" in message
    # render and extend refuse such a template too, instead of producing inconsistent turns
    with pytest.raises(TemplateNotAppendOnly):
        render(conversations[1], CharProcessor(THINK_STRIPPING))
    stripping = CharProcessor(THINK_STRIPPING)
    r = render(conversations[1][:1], stripping)
    r = extend(r, [], assistant_token_ids=sampled(stripping, "<think>a</think>B"), add_generation_prompt=False)
    with pytest.raises(TemplateNotAppendOnly):
        extend(r, [Message("user", "Q2")])


def test_a_template_that_drops_media_is_an_error():
    drops = CHATML.replace("{{- '<|vision_bos|><|IMAGE|><|vision_eos|>' -}}", "")
    with pytest.raises(ValueError, match="no placeholder"):
        render([Message("user", (image(1), TextPart("x")))], CharProcessor(drops))
