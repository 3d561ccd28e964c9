"""``stream: true`` for the OpenAI endpoint: a finished ``chat.completion`` as Server-Sent Events.

The embedded engine has no incremental output (one ``model.generate`` per batch), so the endpoint generates the
whole completion first and then sends it as OpenAI's ``chat.completion.chunk`` events: the role, the content in
pieces (a few words each), one ``tool_calls`` delta per call (id, name and the complete arguments), a last chunk
with the ``finish_reason`` (and ``logprobs.content`` when asked, plus our ``token_ids`` / ``token_logprobs`` /
``prompt_token_ids`` / ``relax`` fields), with ``stream_options.include_usage`` a chunk with ``usage`` and no
choices, then ``data: [DONE]``. A stream therefore starts only once the completion is done: it saves a client
nothing in latency, it only speaks the protocol clients that always stream expect. The recorded call is the
same as without streaming.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["ChatStream", "chunks"]

_PIECE = re.compile(r"\s*\S+\s*|\s+")
_WORDS_PER_PIECE = 4


def _pieces(text: str) -> list[str]:
    """``text`` cut into pieces of a few words (whitespace kept): ``"".join(_pieces(t)) == t``."""
    words = _PIECE.findall(text)
    return ["".join(words[i:i + _WORDS_PER_PIECE]) for i in range(0, len(words), _WORDS_PER_PIECE)]


def chunks(completion: dict[str, Any], *, include_usage: bool = False) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects that stream ``completion`` (a ``chat.completion`` dict)."""
    (choice,) = completion["choices"]
    message = choice["message"]
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], "system_fingerprint": completion.get("system_fingerprint")}
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in _pieces(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or ()):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    last = chunk({}, finish_reason=choice["finish_reason"], logprobs=choice.get("logprobs"),
                 token_ids=choice.get("token_ids"), token_logprobs=choice.get("token_logprobs"))
    last["prompt_token_ids"] = completion.get("prompt_token_ids")
    last["relax"] = completion.get("relax")
    out.append(last)
    if include_usage:
        out.append({**base, "choices": [], "usage": completion["usage"]})
    return out


class ChatStream:
    """A streamed answer: ``completion`` is the whole ``chat.completion`` (for in-process callers); iterating
    gives the SSE byte strings to send, ``data: [DONE]`` last."""

    content_type = "text/event-stream"

    def __init__(self, completion: dict[str, Any], *, include_usage: bool = False) -> None:
        self.completion = completion
        self.include_usage = include_usage

    def events(self) -> list[dict[str, Any]]:
        return chunks(self.completion, include_usage=self.include_usage)

    def __iter__(self) -> Iterator[bytes]:
        for event in self.events():
            yield b"data: " + json.dumps(event, allow_nan=False).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
