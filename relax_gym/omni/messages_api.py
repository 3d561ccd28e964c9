"""Anthropic's Messages API (``POST /v1/messages``) in terms of OpenAI chat completions.

Anthropic's client and the agents built on it call ``/v1/messages``. A request becomes the chat-completions call it
means (:func:`chat_body`), which an endpoint runs and records like any other, and the chat completion becomes an
Anthropic ``message`` (:func:`message_object`). What maps to what:

- ``system`` (a string or text blocks) -> a first ``system`` message;
- ``messages``: ``user`` / ``assistant`` turns whose content is a string or blocks: ``text`` -> text; ``image``
  (``source`` base64 with its ``media_type``, or a ``url``) -> an image; an assistant's ``tool_use`` -> its tool
  call (``input`` as the arguments' JSON); a user's ``tool_result`` blocks -> ``tool`` messages (before the rest of
  that turn; their content a string or text / image blocks; ``is_error`` written into the text); ``thinking`` and
  ``redacted_thinking`` blocks are dropped;
- ``tools`` (``name``, ``description``, ``input_schema``) -> function tools; ``tool_choice`` ``auto`` / ``any`` /
  ``tool`` (``name``) / ``none`` -> ``auto`` / ``required`` / that function / ``none``;
- ``max_tokens`` (required) -> ``max_completion_tokens``; ``stop_sequences`` -> ``stop``; ``temperature``,
  ``top_p``, ``top_k`` as in chat; ``metadata.user_id`` -> ``user``;
- the answer: ``content`` holds a ``text`` block when the reply has text, then one ``tool_use`` block per tool call
  (``input`` the parsed arguments); ``stop_reason`` ``tool_use``, ``max_tokens`` or ``end_turn``; ``usage`` in
  input / output tokens.

Errors use Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}`` (:func:`error_body`). ``stream:
true`` is answered with Anthropic's events as the engine generates (the gateway's
:mod:`~relax_gym.trainer.gateway.live_stream`). Not served: ``document`` / ``search_result`` blocks, server tools (web search, code
execution, ...), ``thinking`` budgets; ``service_tier``, ``container``, ``mcp_servers`` are refused unless null.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relax_gym.omni.request_errors import field_error

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


class MessagesRequestError(ValueError):
    """A request this endpoint cannot serve; the message names the field first."""


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


class MessagesRequest(BaseModel):
    """The body of ``POST /v1/messages`` (the fields this endpoint reads)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    metadata: dict[str, Any] | None = None
    stream: bool = False
    thinking: dict[str, Any] | None = None
    service_tier: Any = None
    container: Any = None
    mcp_servers: Any = None


def parse_request(body: Any) -> MessagesRequest:
    """The request, or a :class:`MessagesRequestError` naming the first field at fault."""
    if not isinstance(body, dict):
        raise MessagesRequestError("the body must be a JSON object with 'model', 'max_tokens' and 'messages'")
    try:
        req = MessagesRequest.model_validate(body)
    except ValidationError as exc:
        raise MessagesRequestError(field_error(exc, "Messages API")[0]) from None
    if req.thinking not in (None, {"type": "disabled"}):
        raise MessagesRequestError("thinking: extended thinking budgets are not served (the policy thinks in its text)")
    for name in ("service_tier", "container", "mcp_servers"):
        if getattr(req, name) not in (None, "auto", "standard_only"):
            raise MessagesRequestError(f"{name}: not served")
    return req


def _image(source: Any, where: str) -> dict[str, Any]:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return {"type": "image_url", "image_url": {"url": f"data:{source.get('media_type', 'image/png')};base64,"
                                                          f"{source.get('data', '')}"}}
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise MessagesRequestError(f"{where}.source: an image source must be base64 (media_type, data) or a url")


def _content_part(block: Any, where: str) -> dict[str, Any] | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if kind == "image":
        return _image(block.get("source"), where)
    if kind in ("thinking", "redacted_thinking"):
        return None
    raise MessagesRequestError(f"{where}: content block of type {kind!r} is not served here (text, image, tool_use, "
                               f"tool_result)")


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content", "")
    if isinstance(content, list):
        parts = [p for j, b in enumerate(content) if (p := _content_part(b, f"{where}.content[{j}]")) is not None]
        content = parts if any(p["type"] != "text" for p in parts) else "".join(p["text"] for p in parts)
    if block.get("is_error"):
        content = f"Error: {content}" if isinstance(content, str) else [{"type": "text", "text": "Error:"}, *content]
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": content}


def _turn(message: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}]"
    role = message.get("role") if isinstance(message, dict) else None
    if role not in ("user", "assistant"):
        raise MessagesRequestError(f"{where}.role: {role!r} is not user or assistant")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise MessagesRequestError(f"{where}.content: must be a string or a list of blocks")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result" and role == "user":
            out.append(_tool_result(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": {
                "name": str(block.get("name") or ""), "arguments": json.dumps(block.get("input") or {})}})
        elif (part := _content_part(block, at)) is not None:
            parts.append(part)
    if role == "assistant":
        message_out: dict[str, Any] = {"role": "assistant", "content": "".join(p.get("text", "") for p in parts) or None}
        if calls:
            message_out["tool_calls"] = calls
        return [message_out]
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def chat_body(req: MessagesRequest) -> dict[str, Any]:
    """The chat-completions body ``req`` means."""
    messages: list[dict[str, Any]] = []
    if req.system:
        text = req.system if isinstance(req.system, str) else "".join(
            str(b.get("text", "")) for b in req.system if isinstance(b, dict) and b.get("type") == "text")
        messages.append({"role": "system", "content": text})
    for i, message in enumerate(req.messages):
        messages += _turn(message, i)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "max_completion_tokens": req.max_tokens}
    if req.tools:
        tools = []
        for i, tool in enumerate(req.tools):
            if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
                raise MessagesRequestError(f"tools[{i}]: server tools ({tool.get('type')!r}) are not served; tools "
                                           f"with name, description and input_schema only")
            tools.append({"type": "function", "function": {"name": tool.get("name"), "description": tool.get(
                "description", ""), "parameters": tool["input_schema"]}})
        body["tools"] = tools
    if req.tool_choice is not None:
        kind = req.tool_choice.get("type")
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            choice = {"type": "function", "function": {"name": req.tool_choice.get("name")}}
        if choice is None:
            raise MessagesRequestError(f"tool_choice.type: {kind!r} is not auto, any, tool or none")
        body["tool_choice"] = choice
    for key, value in (("stop", req.stop_sequences), ("temperature", req.temperature), ("top_p", req.top_p),
                       ("top_k", req.top_k), ("user", (req.metadata or {}).get("user_id"))):
        if value is not None:
            body[key] = value
    return body


def message_object(req: MessagesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as an Anthropic ``message``."""
    choice = chat["choices"][0]
    reply = choice["message"]
    content: list[dict[str, Any]] = []
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = {}
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": arguments if isinstance(arguments, dict) else {"value": arguments}})
    stop = {"tool_calls": "tool_use", "length": "max_tokens"}.get(choice["finish_reason"], "end_turn")
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": req.model,
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": chat["usage"]["prompt_tokens"], "output_tokens": chat["usage"]["completion_tokens"]},
            "relax": chat.get("relax", {})}
