"""``stream: true`` for the OpenAI endpoint when the engine cannot stream: a finished ``chat.completion`` as
Server-Sent Events. (An engine that hands out its tokens as it samples them is streamed live instead:
:mod:`~relax_gym.trainer.gateway.live_stream`.)

The endpoint generates the whole completion first and then sends it as OpenAI's ``chat.completion.chunk`` events: the role, the content in
pieces (a few words each), one ``tool_calls`` delta per call (id, name and the complete arguments), a last chunk
with the ``finish_reason`` (and ``logprobs.content`` when asked, plus our ``token_ids`` / ``token_logprobs`` /
``prompt_token_ids`` / ``relax`` fields), with ``stream_options.include_usage`` a chunk with ``usage`` and no
choices, then ``data: [DONE]``. A stream therefore starts only once the completion is done: it saves a client
nothing in latency, it only speaks the protocol clients that always stream expect. The recorded call is the
same as without streaming.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from relax_gym.omni.api_streams import chunk_maker, sse, tail_chunks

__all__ = ["ChatStream", "chunks"]

_PIECE = re.compile(r"\s*\S+\s*|\s+")
_WORDS_PER_PIECE = 4


def _pieces(text: str) -> list[str]:
    """``text`` cut into pieces of a few words (whitespace kept): ``"".join(_pieces(t)) == t``."""
    words = _PIECE.findall(text)
    return ["".join(words[i:i + _WORDS_PER_PIECE]) for i in range(0, len(words), _WORDS_PER_PIECE)]


def chunks(completion: dict[str, Any], *, include_usage: bool = False) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects that stream ``completion`` (a ``chat.completion`` dict)."""
    message = completion["choices"][0]["message"]
    chunk = chunk_maker(completion, include_usage=include_usage)
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in _pieces(message.get("content") or "")]
    return out + tail_chunks(completion, include_usage=include_usage)


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
            yield sse(event)
        yield b"data: [DONE]\n\n"
