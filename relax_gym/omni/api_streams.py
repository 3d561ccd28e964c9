"""``stream: true`` in each API's own events, from a chat completion that is being generated or exists whole:
Chat Completions' ``chat.completion.chunk`` events, the Responses API's typed events, Anthropic's Messages events.

A source (:class:`CompletionSource`) gives the content in pieces as they become final (``pieces()``) and then the
whole ``chat.completion`` (``completion()``); the pieces join to the completion's content. The trainer's gateway
streams a call as the engine generates it (``relax_gym.trainer.gateway.live_stream.LiveCompletion``);
:class:`DoneCompletion` is a completion that exists whole (an engine that answers only at the end; the
turn-by-turn endpoint, whose replies come from the env). Tool calls, the finish reason and the usage come once the
completion is known (a call's arguments whole, in one delta).

Each stream is an iterable of Server-Sent Events (``live = True``: an HTTP server writes each as it comes). A
failure after the first event becomes the API's error event (Chat Completions: ``data: {"error": ...}``; the
Responses API: ``response.failed``; Messages: ``event: error``), then the stream ends.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from relax_gym.omni.messages_api import MessagesRequest, message_object
from relax_gym.omni.responses_api import ResponsesRequest, response_object

__all__ = ["ChatEvents", "CompletionSource", "DoneCompletion", "MessagesEvents", "ResponsesEvents", "chunk_maker",
           "sse", "tail_chunks"]


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event: ``event:`` (when named) and ``data:`` lines."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(data, allow_nan=False).encode() + b"\n\n"


def chunk_maker(completion: dict[str, Any], *, include_usage: bool = False) -> Any:
    """``chunk(delta, **choice_fields)``: a ``chat.completion.chunk`` of ``completion`` (its id, created, model;
    only ``id`` / ``created`` / ``model`` are read, so a live stream passes them before the completion exists)."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], "system_fingerprint": completion.get("system_fingerprint")}
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}]}

    return chunk


def tail_chunks(completion: dict[str, Any], *, include_usage: bool = False) -> list[dict[str, Any]]:
    """The chunks after the content: one ``tool_calls`` delta per call, the last chunk (finish reason, log-probs,
    our token fields), and with ``include_usage`` the usage chunk."""
    (choice,) = completion["choices"]
    message = choice["message"]
    chunk = chunk_maker(completion, include_usage=include_usage)
    out = []
    for i, call in enumerate(message.get("tool_calls") or ()):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    last = chunk({}, finish_reason=choice["finish_reason"], logprobs=choice.get("logprobs"),
                 token_ids=choice.get("token_ids"), token_logprobs=choice.get("token_logprobs"))
    last["prompt_token_ids"] = completion.get("prompt_token_ids")
    last["relax"] = completion.get("relax")
    out.append(last)
    if include_usage:
        out.append({**chunk({}), "choices": [], "usage": completion["usage"]})
    return out


class CompletionSource(Protocol):
    request_id: str
    created: int
    model: str
    prompt_tokens: int

    def pieces(self) -> Iterator[str]: ...

    def completion(self) -> dict[str, Any]: ...


class DoneCompletion:
    """A chat completion that exists whole: its content is one piece."""

    def __init__(self, completion: dict[str, Any]) -> None:
        self._completion = completion
        self.request_id, self.created, self.model = completion["id"], completion["created"], completion["model"]
        self.prompt_tokens = completion["usage"]["prompt_tokens"]

    def pieces(self) -> Iterator[str]:
        if _content(self._completion):
            yield _content(self._completion)

    def completion(self) -> dict[str, Any]:
        return self._completion


def _content(completion: dict[str, Any]) -> str:
    return completion["choices"][0]["message"].get("content") or ""


def _failure(exc: BaseException) -> str:
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"


class ChatEvents:
    """Chat Completions' ``chat.completion.chunk`` events of ``source``, then ``data: [DONE]``."""

    live = True
    content_type = "text/event-stream"

    def __init__(self, source: CompletionSource, *, include_usage: bool = False) -> None:
        self.source = source
        self.include_usage = include_usage

    @property
    def completion(self) -> dict[str, Any]:
        """The whole ``chat.completion`` (blocks until it is generated): for in-process callers."""
        return self.source.completion()

    def __iter__(self) -> Iterator[bytes]:
        s = self.source
        chunk = chunk_maker({"id": s.request_id, "created": s.created, "model": s.model},
                            include_usage=self.include_usage)
        yield sse(chunk({"role": "assistant", "content": ""}))
        try:
            for piece in s.pieces():
                yield sse(chunk({"content": piece}))
            for event in tail_chunks(s.completion(), include_usage=self.include_usage):
                yield sse(event)
        except Exception as exc:  # noqa: BLE001 - the headers are out: the failure goes as an event
            status = int(getattr(exc, "status", 500) or 500)
            yield sse({"error": {"message": _failure(exc), "type": "server_error" if status >= 500 else
                                 "invalid_request_error", "param": None, "code": status}})
        yield b"data: [DONE]\n\n"


class ResponsesEvents:
    """The Responses API's events for ``source`` (a call of ``req``): ``response.created``, ``in_progress``, the
    message item's ``output_item.added`` / ``content_part.added`` / ``output_text.delta`` ... ``done``, each
    function call's item with its arguments, and ``response.completed`` (``incomplete`` when cut by
    ``max_output_tokens``). ``on_done(response, completion)``: called with the final objects before the last event
    (the gateway keeps them for ``previous_response_id``)."""

    live = True
    content_type = "text/event-stream"

    def __init__(self, source: CompletionSource, req: ResponsesRequest,
                 on_done: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> None:
        self.source, self.req, self.on_done = source, req, on_done
        self.response_id = f"resp_{uuid.uuid4().hex}"
        self._seq = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(data, kind)

    def _skeleton(self, status: str) -> dict[str, Any]:
        empty = response_object(self.req, {"choices": [{"message": {}, "finish_reason": "stop"}],
                                           "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
        return {**empty, "id": self.response_id, "created_at": self.source.created, "status": status,
                "usage": None, "relax": {}}

    def __iter__(self) -> Iterator[bytes]:
        item_id = f"msg_{uuid.uuid4().hex[:24]}"
        opened = False
        given: list[str] = []

        def open_message() -> Iterator[bytes]:
            yield self._event("response.output_item.added", output_index=0, item={
                "id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []})
            yield self._event("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

        yield self._event("response.created", response=self._skeleton("in_progress"))
        yield self._event("response.in_progress", response=self._skeleton("in_progress"))
        try:
            for piece in self.source.pieces():
                if not opened:
                    yield from open_message()
                    opened = True
                given.append(piece)
                yield self._event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0,
                                  delta=piece, logprobs=[])
            chat = self.source.completion()
            response = {**response_object(self.req, chat), "id": self.response_id, "created_at": self.source.created}
            for index, item in enumerate(response["output"]):
                if item["type"] == "message":
                    item["id"] = item_id
                    part = item["content"][0]
                    if not opened:  # nothing was streamed (the whole text came at the end)
                        yield from open_message()
                        yield self._event("response.output_text.delta", item_id=item_id, output_index=index,
                                          content_index=0, delta=part["text"], logprobs=[])
                    yield self._event("response.output_text.done", item_id=item_id, output_index=index,
                                      content_index=0, text=part["text"], logprobs=[])
                    yield self._event("response.content_part.done", item_id=item_id, output_index=index,
                                      content_index=0, part=part)
                else:  # a function call: its arguments whole
                    yield self._event("response.output_item.added", output_index=index,
                                      item={**item, "arguments": "", "status": "in_progress"})
                    yield self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=index, delta=item["arguments"])
                    yield self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, arguments=item["arguments"])
                yield self._event("response.output_item.done", output_index=index, item=item)
            if self.on_done is not None:
                self.on_done(response, chat)
            done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            yield self._event(done, response=response)
        except Exception as exc:  # noqa: BLE001 - the headers are out: the failure goes as an event
            failed = {**self._skeleton("failed"), "error": {"code": "server_error", "message": _failure(exc)}}
            yield self._event("response.failed", response=failed)


class MessagesEvents:
    """Anthropic's Messages events for ``source`` (a call of ``req``): ``message_start``, a text block's
    ``content_block_start`` / ``text_delta`` ... ``content_block_stop``, each ``tool_use`` block with its input as
    one ``input_json_delta``, ``message_delta`` (stop reason, output tokens) and ``message_stop``."""

    live = True
    content_type = "text/event-stream"

    def __init__(self, source: CompletionSource, req: MessagesRequest) -> None:
        self.source, self.req = source, req
        self.message_id = f"msg_{uuid.uuid4().hex[:24]}"

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, kind)

    def __iter__(self) -> Iterator[bytes]:
        yield self._event("message_start", message={
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.req.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.source.prompt_tokens, "output_tokens": 0}})
        opened = False
        try:
            for piece in self.source.pieces():
                if not opened:
                    yield self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                    opened = True
                yield self._event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
            message = message_object(self.req, self.source.completion())
            for index, block in enumerate(message["content"]):
                if block["type"] == "text":
                    if not opened:
                        yield self._event("content_block_start", index=index,
                                          content_block={"type": "text", "text": ""})
                        yield self._event("content_block_delta", index=index,
                                          delta={"type": "text_delta", "text": block["text"]})
                else:
                    yield self._event("content_block_start", index=index, content_block={**block, "input": {}})
                    yield self._event("content_block_delta", index=index, delta={
                        "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)})
                yield self._event("content_block_stop", index=index)
            yield self._event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                              usage={"output_tokens": message["usage"]["output_tokens"]})
            yield self._event("message_stop")
        except Exception as exc:  # noqa: BLE001 - the headers are out: the failure goes as an event
            yield self._event("error", error={"type": "api_error", "message": _failure(exc)})
