"""OpenAI function calling over the Hermes / Qwen tool-call text (:mod:`relax_gym.omni.tool_calls`).

Into the prompt: the request's ``tools`` become the tool instructions (their schemas inside ``<tools>``) in the
system message -- appended to the caller's own system message after a blank line, or a system message of their
own -- unless ``tool_choice`` is ``"none"``; ``"required"`` and a named function add a sentence that says so.
An assistant message's ``tool_calls`` become ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` text
after its content (one per line); when the calls are ones this endpoint returned (their ids) and the message
still says what was returned, the text is exactly what the model wrote. A ``tool`` message's content is wrapped
in ``<tool_response>\\n`` ... ``\\n</tool_response>`` (as the environments write tool results; content that is
already wrapped is kept), its ``name`` taken from the call it answers. ``developer`` messages are system messages.

Out of the completion: every well-formed ``<tool_call>`` block becomes an OpenAI tool call (``call_<hex>`` id,
``type: "function"``, ``function.arguments`` a JSON string); the text outside them is the content (None when
empty). A malformed or unclosed block is left in the content.

Used by the OpenAI endpoint (:mod:`relax_gym.trainer.gateway.api`) and the environments' turn proxy.
This module imports nothing of relax_gym outside ``relax_gym.omni``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relax_gym.omni.chat_json import ConversationFormatError
from relax_gym.omni.tool_calls import (
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    ToolCall,
    find_tool_calls,
    format_tool_call,
    tools_instructions,
)

__all__ = ["FunctionTool", "ToolMode", "ToolSpecError", "conversation_dicts", "new_call_id", "reply_key", "split_reply", "tool_mode"]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(BaseModel):
    """One entry of ``tools``: ``{"type": "function", "function": {"name", "description", "parameters"}}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDef

    def schema(self) -> dict[str, Any]:
        """The schema the model reads (``strict`` left out: it means nothing to the model)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True, exclude={"strict"})}


class ToolSpecError(ValueError):
    """``tools`` / ``tool_choice`` that do not make sense together; the message starts with the field."""


@dataclass(frozen=True)
class ToolMode:
    """What ``tools`` + ``tool_choice`` ask: ``listed`` (the tools are in the prompt and calls are parsed),
    ``required`` (a call must be made), ``name`` (this function must be called)."""

    listed: bool = False
    required: bool = False
    name: str | None = None


def tool_mode(tools: Sequence[FunctionTool] | None, tool_choice: Any) -> ToolMode:
    """Check ``tool_choice`` against ``tools``; a :class:`ToolSpecError` says what is wrong (the field is ``tool_choice``
    unless the message starts with ``tools``)."""
    names = [t.function.name for t in tools or ()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolSpecError(f"tools: function names must be unique, {', '.join(dupes)} repeat")
    if tool_choice is None:
        return ToolMode(listed=bool(names))
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ToolSpecError(f"tool_choice: {tool_choice!r} is not 'auto', 'none', 'required' or a named function")
        if tool_choice == "required" and not names:
            raise ToolSpecError("tool_choice: 'required' needs tools")
        return ToolMode(listed=bool(names) and tool_choice != "none", required=tool_choice == "required")
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    if not (isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function" and isinstance(fn, Mapping)
            and isinstance(fn.get("name"), str) and set(tool_choice) <= {"type", "function"}):
        raise ToolSpecError('tool_choice: a named choice is {"type": "function", "function": {"name": "..."}}')
    if fn["name"] not in names:
        raise ToolSpecError(f"tool_choice: function {fn['name']!r} is not in tools ({', '.join(names) or 'none given'})")
    return ToolMode(listed=True, required=True, name=fn["name"])


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# ------------------------------------------------------------------------------------------------ into the prompt


def conversation_dicts(messages: Sequence[Mapping[str, Any]], tools: Sequence[FunctionTool] | None, mode: ToolMode,
                       raw_text: Callable[[Sequence[Mapping[str, Any]], tuple[Any, ...]], str | None] = lambda ids, key: None,
                       ) -> list[dict[str, Any]]:
    """The request's messages as :func:`relax_gym.omni.from_openai` reads them, tools rendered as text.
    ``raw_text(tool_calls, key)``: the text the model wrote for an assistant message whose :func:`reply_key` is
    ``key``, when known. A :class:`~relax_gym.omni.ConversationFormatError` names the message."""
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ConversationFormatError(f"message {i}: must be an object with 'role' and 'content'")
        role = message.get("role")
        item = {k: v for k, v in message.items() if k in ("role", "content", "name", "tool_call_id")}
        if role == "developer":
            item["role"] = "system"
        elif role == "assistant":
            item["content"] = _assistant_text(message, i, raw_text, call_names)
        elif role == "tool":
            item.update(_tool_message(message, i, call_names))
        out.append(item)
    if mode.listed:
        text = tools_instructions([t.schema() for t in tools or ()], required=mode.required, name=mode.name)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": _append_text(out[0].get("content"), "\n\n" + text)}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _assistant_text(message: Mapping[str, Any], i: int, raw_text: Callable[..., str | None],
                    call_names: dict[str, str]) -> Any:
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ConversationFormatError(f"message {i}: tool_calls must be a list")
    parsed = [_incoming_call(c, f"message {i}: tool_calls[{j}]") for j, c in enumerate(calls)]
    for call_id, name, _ in parsed:
        if call_id:
            call_names[call_id] = name
    if not parsed:
        return "" if content is None else content
    raw = raw_text(calls, reply_key(content, calls))
    if raw is not None:
        return raw
    text = _content_text(content, f"message {i}")
    blocks = "\n".join(format_tool_call(name, args) for _, name, args in parsed)
    return f"{text}\n{blocks}" if text else blocks


def _incoming_call(call: Any, where: str) -> tuple[str | None, str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ConversationFormatError(f"{where}: needs {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}")
    if call.get("type", "function") != "function":
        raise ConversationFormatError(f"{where}: type {call.get('type')!r} is not 'function'")
    args = fn.get("arguments", "{}")
    if not isinstance(args, str | Mapping):
        raise ConversationFormatError(f"{where}: function.arguments must be a JSON string")
    call_id = call.get("id")
    return (call_id if isinstance(call_id, str) else None), fn["name"], (dict(args) if isinstance(args, Mapping) else args)


def _tool_message(message: Mapping[str, Any], i: int, call_names: Mapping[str, str]) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise ConversationFormatError(f"message {i}: a tool message needs the string tool_call_id of the call it answers")
    content = message.get("content")
    if isinstance(content, str):
        wrapped: Any = content if content.startswith(TOOL_RESPONSE_OPEN) else TOOL_RESPONSE_OPEN + content + TOOL_RESPONSE_CLOSE
    elif isinstance(content, list):
        first = content[0] if content else None
        done = isinstance(first, Mapping) and str(first.get("text", "")).startswith(TOOL_RESPONSE_OPEN)
        wrapped = content if done else [{"type": "text", "text": TOOL_RESPONSE_OPEN}, *content,
                                        {"type": "text", "text": TOOL_RESPONSE_CLOSE}]
    else:
        raise ConversationFormatError(f"message {i}: a tool message's content must be a string or a list of parts")
    name = message.get("name") or call_names.get(call_id)
    return {"content": wrapped, **({"name": name} if name else {})}


def _append_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    return ("" if content is None else str(content)) + text


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ConversationFormatError(f"{where}: an assistant message's content must be a string or text parts")


# ------------------------------------------------------------------------------------------------ out of the completion


def split_reply(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """A completion's content and OpenAI tool calls. Without a well-formed block the content is ``text``
    unchanged; with blocks it is the text around them, stripped (None when nothing is left)."""
    spans = [s for s in find_tool_calls(text) if isinstance(s.call, ToolCall)]
    if not spans:
        return text, []
    pieces, pos = [], 0
    for span in spans:
        pieces.append(text[pos:span.start])
        pos = span.end
    pieces.append(text[pos:])
    content = "".join(pieces).strip() or None
    calls = [{"id": new_call_id(), "type": "function",
              "function": {"name": s.call.name, "arguments": json.dumps(s.call.arguments, ensure_ascii=False)}}
             for s in spans]
    return content, calls


def reply_key(content: Any, tool_calls: Sequence[Any] | None) -> tuple[Any, ...]:
    """What an assistant message says, for comparing a message a client sends back with the one it was given:
    the content's text (stripped; None and "" alike) and each call's name and JSON-normalised arguments."""
    try:
        text = _content_text(content, "").strip()
    except ValueError:
        text = repr(content)
    calls = []
    for call in tool_calls or ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            calls.append(("?", repr(call)))
            continue
        calls.append((fn.get("name"), _canonical(fn.get("arguments", "{}"))))
    return text, tuple(calls)


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    try:
        return json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(arguments)
