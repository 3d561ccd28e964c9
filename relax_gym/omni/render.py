"""Conversations → token ids, loss mask and media tensors, token-in-token-out across turns.

``render(messages, processor)`` turns a conversation of :class:`~relax_gym.omni.Message` into ``input_ids``, a
``loss_mask`` that is 1 only on what the assistant produced (its content and its closing end-of-turn token, not the
``<|im_start|>assistant\\n`` header nor the newline the template adds after the turn), and the tensors of every
media part, in conversation order. ``extend(prev, new_messages, assistant_token_ids=...)`` continues a rendering:
it appends the ids the policy actually sampled (never re-tokenised), then the new tool / user messages and the next
generation prompt, so turn *k+1*'s input starts with exactly turn *k*'s ids and media tensors. A multi-turn episode
is rendered once, incrementally; ``render`` of the whole conversation gives the same result when the sampled ids
are the canonical tokenisation of the text.

How: each message is the difference between the chat template applied to the conversation up to and including it
and up to just before it; each difference is tokenised on its own (as the policy saw it during generation), and
media placeholders are expanded by the processor. That requires a template that never rewrites earlier turns;
every render checks it and raises :class:`TemplateNotAppendOnly`, and :func:`check_append_only` checks a
template on sample conversations up front (templates that strip ``<think>`` from past assistant turns, as some
Qwen3 templates do, fail it).

The processor is duck-typed (``relax_gym.trainer.policy.processor.OmniProcessor`` is one); it must provide

- ``apply_chat_template(list_of_dicts, tokenize=False, add_generation_prompt=bool) -> str``;
- ``encode_text(text) -> list[int]`` (no special tokens added);
- ``media_token_ids``: ``{"image": id, "video": id, "audio": id}``, the placeholder the template writes per item;
- ``encode_media(kind, decoded) -> obj`` with ``.token_ids`` (the placeholder's expansion) and ``.tensors``
  (a dict of tensors whose first axis concatenates across items);
- ``eos_token`` (str) and ``eos_token_id`` (int): the end-of-turn token the assistant samples last;
- optionally ``decode(ids, skip_special_tokens=False)`` and ``tokenizer.convert_ids_to_tokens`` (messages).

This module imports nothing of relax_gym outside ``relax_gym.omni``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from relax_gym.omni.cache import DecodeCache, default_cache
from relax_gym.omni.parts import MEDIA_KINDS, Message, TextPart

__all__ = ["Rendered", "TemplateNotAppendOnly", "check_append_only", "concat_media", "extend", "render", "to_template_dicts"]


class TemplateNotAppendOnly(ValueError):
    """The chat template rendered an earlier part of the conversation differently once more turns were added."""


@dataclass(frozen=True, eq=False)
class Rendered:
    """A rendered conversation. ``mm`` holds every media item's tensors concatenated in conversation order;
    ``num_media`` counts items per kind. The other fields let :func:`extend` continue without re-rendering."""

    input_ids: list[int]
    loss_mask: list[int]
    mm: dict[str, torch.Tensor]
    num_media: dict[str, int]
    messages: tuple[Message, ...] = ()
    text: str = ""  # the template text that input_ids cover (the generation prompt included when open)
    generation_prompt: bool = False  # input_ids end with the generation prompt: the assistant speaks next
    media_items: tuple[Mapping[str, torch.Tensor], ...] = field(default=(), repr=False)
    processor: Any = field(default=None, repr=False)  # what rendered it; extend() continues with it

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def render(messages: Sequence[Message], processor: Any, *, add_generation_prompt: bool = True,
           cache: DecodeCache | None = default_cache) -> Rendered:
    """Render a whole conversation. Assistant messages are tokenised from their text (loss mask 1 on their
    content and end-of-turn token); everything else has loss mask 0."""
    return _append(processor, _empty(), list(messages), None, add_generation_prompt, cache)


def extend(prev: Rendered, new_messages: Sequence[Message], *, assistant_token_ids: Sequence[int] | None = None,
           add_generation_prompt: bool = True, processor: Any = None,
           cache: DecodeCache | None = default_cache) -> Rendered:
    """Continue ``prev`` (which must end with the generation prompt when ``assistant_token_ids`` is given).

    ``assistant_token_ids`` are the ids the policy sampled for its turn, appended exactly as given (loss mask 1);
    if they do not end with the end-of-turn token (the sample was cut at the length limit) it is appended with
    loss mask 0; pad ids after the end-of-turn token (a batched ``generate`` row) are dropped. The assistant message of that turn is ``new_messages[0]`` when it is an assistant message
    (e.g. the env's history entry for the action), else the decoded ids. Then ``new_messages`` (tool results,
    user replies, in order, their media appended after ``prev``'s) and, with ``add_generation_prompt``, the next
    generation prompt. The processor is ``prev``'s unless given."""
    processor = processor if processor is not None else prev.processor
    if processor is None:
        raise ValueError("extend() needs a processor: prev carries none, pass processor=")
    return _append(processor, prev, list(new_messages), assistant_token_ids, add_generation_prompt, cache)


def to_template_dicts(messages: Iterable[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages → the OpenAI-style dicts chat templates read: content a list of ``{"type": "text", "text": ...}``
    and ``{"type": "image" | "video" | "audio"}`` parts; ``name`` / ``tool_call_id`` kept when set."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, Mapping):
            out.append(dict(m))
            continue
        d: dict[str, Any] = {
            "role": m.role,
            "content": [{"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": p.kind} for p in m.content],
        }
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def check_append_only(processor: Any, sample_conversations: Iterable[Sequence[Message | Mapping[str, Any]]]) -> int:
    """Render each conversation with the chat template at every prefix (with and without the generation prompt
    before assistant turns) and check that each rendering starts with the previous one. Raises
    :class:`TemplateNotAppendOnly` naming the conversation, the message, the first differing character and token
    positions and the tokens around them. Returns the number of prefix pairs checked."""
    checked = 0
    for c, conversation in enumerate(sample_conversations):
        dicts = to_template_dicts(conversation)
        before = ""
        for k in range(len(dicts)):
            where = f"conversation {c}, message {k} ({dicts[k].get('role')})"
            if dicts[k].get("role") == "assistant":
                prompt = _template(processor, dicts[:k], True)
                _check_prefix(processor, before, prompt, f"{where}: the generation prompt")
                before = prompt
                checked += 1
            now = _template(processor, dicts[: k + 1], False)
            _check_prefix(processor, before, now, where)
            before = now
            checked += 1
        if dicts:
            _check_prefix(processor, before, _template(processor, dicts, True), f"conversation {c}: final generation prompt")
            checked += 1
    return checked


# ---------------------------------------------------------------------------------------------- internals


def _empty() -> Rendered:
    return Rendered(input_ids=[], loss_mask=[], mm={}, num_media=dict.fromkeys(MEDIA_KINDS, 0))


def _append(processor: Any, prev: Rendered, queue: list[Message], assistant_ids: Sequence[int] | None,
            add_generation_prompt: bool, cache: DecodeCache | None) -> Rendered:
    msgs = list(prev.messages)
    dicts = to_template_dicts(msgs)
    text = prev.text
    prompt_open = prev.generation_prompt
    ids, mask = list(prev.input_ids), list(prev.loss_mask)
    items = list(prev.media_items)
    counts = dict(prev.num_media)
    eos, eos_id = str(processor.eos_token), int(processor.eos_token_id)

    def add(seg: str, loss: int, parts: Sequence[Any] = ()) -> None:
        seg_ids, seg_mask, seg_items = _encode_segment(processor, seg, loss, parts, cache)
        ids.extend(seg_ids)
        mask.extend(seg_mask)
        items.extend(seg_items)
        for part in parts:
            counts[part.kind] = counts.get(part.kind, 0) + 1

    if assistant_ids is not None:
        assistant_ids = _through_eos(processor, [int(i) for i in assistant_ids])
        if not prompt_open:
            raise ValueError("assistant_token_ids continue a generation prompt, but the previous render does not end with one")
        if queue and queue[0].role == "assistant":
            message = queue.pop(0)
        else:
            content = assistant_ids[:-1] if assistant_ids and assistant_ids[-1] == eos_id else assistant_ids
            message = Message(role="assistant", content=(TextPart(processor.decode(content, skip_special_tokens=False)),))
        dicts.append(to_template_dicts([message])[0])
        new_text = _template(processor, dicts, False)
        _check_prefix(processor, text, new_text, f"message {len(msgs)} (assistant)")
        body = new_text[len(text):]
        ids.extend(assistant_ids)
        mask.extend([1] * len(assistant_ids))
        cut = body.find(eos)
        if cut >= 0:
            if not assistant_ids or assistant_ids[-1] != eos_id:
                ids.append(eos_id)  # cut at the length limit: close the turn, but the policy did not say it
                mask.append(0)
            add(body[cut + len(eos):], 0)
        msgs.append(message)
        text, prompt_open = new_text, False

    for message in queue:
        where = f"message {len(msgs)} ({message.role})"
        dicts.append(to_template_dicts([message])[0])
        if message.role == "assistant":
            if not prompt_open:
                prompt = _template(processor, dicts[:-1], True)
                _check_prefix(processor, text, prompt, f"{where}: the generation prompt")
                add(prompt[len(text):], 0)
                text = prompt
            new_text = _template(processor, dicts, False)
            _check_prefix(processor, text, new_text, where)
            body = new_text[len(text):]
            cut = body.find(eos)
            if cut < 0:
                add(body, 1, message.media())
            else:
                add(body[:cut], 1, message.media())
                ids.append(eos_id)
                mask.append(1)
                add(body[cut + len(eos):], 0)
        else:
            if prompt_open:
                raise ValueError(f"{where}: the previous render ends with a generation prompt; give the assistant's "
                                 "turn first (assistant_token_ids= or an assistant message)")
            new_text = _template(processor, dicts, False)
            _check_prefix(processor, text, new_text, where)
            add(new_text[len(text):], 0, message.media())
        msgs.append(message)
        text, prompt_open = new_text, False

    if add_generation_prompt and not prompt_open:
        prompt = _template(processor, dicts, True)
        _check_prefix(processor, text, prompt, "the generation prompt")
        add(prompt[len(text):], 0)
        text, prompt_open = prompt, True

    return Rendered(
        input_ids=ids,
        loss_mask=mask,
        mm=concat_media(items),
        num_media=counts,
        messages=tuple(msgs),
        text=text,
        generation_prompt=prompt_open,
        media_items=tuple(items),
        processor=processor,
    )


def _through_eos(processor: Any, ids: list[int]) -> list[int]:
    """Drop the pad ids a batched ``generate`` writes after a row's end-of-turn token; anything else after it
    is an error (generation stops there)."""
    eos_id = int(processor.eos_token_id)
    if eos_id not in ids:
        return ids
    end = ids.index(eos_id) + 1
    pad = getattr(processor, "pad_token_id", None)
    if any(i != pad for i in ids[end:]):
        raise ValueError(f"assistant_token_ids continue after the end-of-turn token {eos_id} at position {end - 1}")
    return ids[:end]


def _template(processor: Any, dicts: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    if not dicts:
        return ""
    text = processor.apply_chat_template(dicts, tokenize=False, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


def _encode_segment(processor: Any, seg: str, loss: int, parts: Sequence[Any],
                    cache: DecodeCache | None) -> tuple[list[int], list[int], list[Mapping[str, torch.Tensor]]]:
    """Tokenise one template segment; each media placeholder takes the next of ``parts`` (same kind, in order)
    and becomes the processor's expansion (loss mask 0 on media tokens)."""
    if not seg and not parts:
        return [], [], []
    by_id = {int(v): k for k, v in processor.media_token_ids.items()}
    ids: list[int] = []
    mask: list[int] = []
    items: list[Mapping[str, torch.Tensor]] = []
    pending = list(parts)
    for token in processor.encode_text(seg) if seg else []:
        kind = by_id.get(int(token))
        if kind is None:
            ids.append(int(token))
            mask.append(loss)
            continue
        if not pending:
            raise ValueError(f"the rendered text has a {kind} placeholder with no {kind} part left in its message")
        part = pending.pop(0)
        if part.kind != kind:
            raise ValueError(f"the chat template put a {kind} placeholder where the message has a {part.kind} part")
        enc = processor.encode_media(kind, part.decode(cache) if cache is not None else part.decode(None))
        ids.extend(int(i) for i in enc.token_ids)
        mask.extend([0] * len(enc.token_ids))
        items.append(dict(enc.tensors))
    if pending:
        raise ValueError(f"the chat template wrote no placeholder for {len(pending)} media part(s) "
                         f"({', '.join(p.kind for p in pending)}) of the message")
    return ids, mask, items


#: Keys whose items may differ in their last axis: audio features of clips kept at their own length (Qwen3-Omni's
#: processor pads to the longest clip, not to a fixed chunk). Shorter ones are padded with zeros at concatenation;
#: their ``feature_attention_mask`` is 0 there, and the audio towers read only the frames the mask keeps.
PAD_LAST_AXIS = ("input_features", "feature_attention_mask")


def concat_media(items: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-key ``torch.cat`` along the first axis (keys in first-seen order): media tensors of several items, in
    the order the model consumes them (the keys of :data:`PAD_LAST_AXIS` padded to their longest last axis)."""
    grouped: dict[str, list[torch.Tensor]] = {}
    for item in items:
        for key, tensor in item.items():
            grouped.setdefault(key, []).append(tensor)
    for key in PAD_LAST_AXIS:
        tensors = grouped.get(key)
        if tensors and len({t.shape[-1] for t in tensors}) > 1:
            width = max(t.shape[-1] for t in tensors)
            grouped[key] = [torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in tensors]
    return {k: v[0] if len(v) == 1 else torch.cat(v, dim=0) for k, v in grouped.items()}


def _check_prefix(processor: Any, before: str, after: str, where: str) -> None:
    if after.startswith(before):
        return
    pos = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    old_ids, new_ids = processor.encode_text(before), processor.encode_text(after)
    tok = next((i for i, (a, b) in enumerate(zip(old_ids, new_ids)) if a != b), min(len(old_ids), len(new_ids)))
    lo = max(0, tok - 3)
    raise TemplateNotAppendOnly(
        f"the chat template is not append-only at {where}: adding it changed the earlier rendering from "
        f"character {pos} / token {tok} on.\n"
        f"  before: {_names(processor, old_ids[lo:tok + 6])} ... {before[max(0, pos - 30):pos + 50]!r}\n"
        f"  after:  {_names(processor, new_ids[lo:tok + 6])} ... {after[max(0, pos - 30):pos + 50]!r}\n"
        "A template that rewrites past turns (e.g. strips <think> from earlier assistant messages) cannot be "
        "rendered incrementally: turn k+1 would not start with the tokens the policy saw at turn k."
    )


def _names(processor: Any, ids: list[int]) -> list[str]:
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens"):
        return [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]
    return [str(i) for i in ids]
