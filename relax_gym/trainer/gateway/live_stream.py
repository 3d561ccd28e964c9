"""A gateway call streamed as the engine generates it: :class:`LiveCompletion`, the source of the API streams of
:mod:`relax_gym.omni.api_streams`.

:meth:`~LiveCompletion.pieces` gives the content as it becomes final
(:class:`~relax_gym.trainer.engines.token_stream.TextDeltas` over the engine's tokens: nothing from a
``<tool_call>`` block or a stop string on, nothing that a later token could still change), and
:meth:`~LiveCompletion.completion` the whole ``chat.completion`` once the call is recorded — the same object, the
same recorded ids, as without streaming. What the end adds to the pieces comes as a last piece, so they join to the
completion's content.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from relax_gym.trainer.engines.token_stream import TextDeltas, TokenFeed

__all__ = ["LiveCompletion"]


class LiveCompletion:
    """A chat completion being generated: ``feed`` carries the engine's tokens and ends with the recorded
    ``chat.completion``; ``deltas`` turns the tokens into final content."""

    def __init__(self, feed: TokenFeed, deltas: TextDeltas, *, request_id: str, created: int, model: str,
                 prompt_tokens: int) -> None:
        self.feed, self.deltas = feed, deltas
        self.request_id, self.created, self.model, self.prompt_tokens = request_id, created, model, prompt_tokens

    def pieces(self) -> Iterator[str]:
        for token in self.feed:
            piece = self.deltas.push(token)
            if piece:
                yield piece
        rest = self.deltas.rest(_content(self.feed.wait()))
        if rest:
            yield rest

    def completion(self) -> dict[str, Any]:
        return self.feed.wait()


def _content(completion: dict[str, Any]) -> str:
    return completion["choices"][0]["message"].get("content") or ""
