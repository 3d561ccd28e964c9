"""The Hermes / Qwen tool-calling text format, shared by the environments and the OpenAI endpoint.

A model is told its tools in the system prompt (:func:`tools_instructions`: the JSON schemas inside
``<tools></tools>``), calls one by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in its
reply (:func:`format_tool_call` writes one, :func:`find_tool_calls` / :func:`parse_tool_calls` read them back) and
reads each result in a ``tool`` turn wrapped in ``<tool_response>`` ... ``</tool_response>``
(:data:`TOOL_RESPONSE_OPEN` / :data:`TOOL_RESPONSE_CLOSE`).

Parsing never raises: a block that is not a JSON object with a string ``name`` and an object ``arguments`` (a JSON
string holding an object is accepted too), or a ``<tool_call>`` left open at the end, is a :class:`BadToolCall`
carrying the reason.

This module imports nothing of relax_gym.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "TOOL_RESPONSE_CLOSE", "TOOL_RESPONSE_OPEN", "BadToolCall", "ToolCall",
    "ToolCallSpan", "find_tool_calls", "format_tool_call", "parse_tool_calls", "tools_instructions",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>\n"
TOOL_RESPONSE_CLOSE = "\n</tool_response>"

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class BadToolCall:
    """A ``<tool_call>`` block that could not be understood; ``error`` says why (it goes back to the model)."""

    raw: str
    error: str


@dataclass(frozen=True)
class ToolCallSpan:
    """Where a block stands in the text: ``text[start:end]`` is the whole ``<tool_call>…</tool_call>`` block (for
    an unclosed block, from ``<tool_call>`` to the end of the text)."""

    start: int
    end: int
    call: ToolCall | BadToolCall


def find_tool_calls(text: str) -> list[ToolCallSpan]:
    """Every ``<tool_call>…</tool_call>`` block in order with its span; a ``<tool_call>`` after the last
    ``</tool_call>`` that is never closed is a :class:`BadToolCall` spanning to the end."""
    spans = [ToolCallSpan(m.start(), m.end(), _parse_one(m.group(1).strip())) for m in _CALL.finditer(text)]
    tail_start = text.rfind(TOOL_CALL_CLOSE) + len(TOOL_CALL_CLOSE) if TOOL_CALL_CLOSE in text else 0
    opened = text.find(TOOL_CALL_OPEN, tail_start)
    if opened >= 0:
        spans.append(ToolCallSpan(opened, len(text), BadToolCall(raw=text[opened:][:200],
                                                                 error="<tool_call> is not closed by </tool_call>")))
    return spans


def parse_tool_calls(text: str) -> list[ToolCall | BadToolCall]:
    """Every ``<tool_call>…</tool_call>`` block in order; an unclosed ``<tool_call>`` is a BadToolCall too."""
    return [span.call for span in find_tool_calls(text)]


def format_tool_call(name: str, arguments: Mapping[str, Any] | str) -> str:
    """One call as the model writes it: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. ``arguments``
    may be a JSON string (OpenAI's form); one that is not a JSON object is written as the string it is."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            parsed = arguments
        arguments = parsed if isinstance(parsed, dict) else arguments
    return TOOL_CALL_OPEN + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + TOOL_CALL_CLOSE


def tools_instructions(schemas: Iterable[Mapping[str, Any]], *, required: bool = False, name: str | None = None) -> str:
    """Tool instructions listing each schema (one JSON line each, OpenAI's ``{"type": "function", "function":
    {...}}`` form). ``required``: say that the reply must call a tool; ``name``: that it must call this one."""
    lines = "\n".join(json.dumps(dict(s)) for s in schemas)
    text = (
        "You may call tools. Available tools, as JSON schemas:\n<tools>\n" + lines + "\n</tools>\n"
        'To call a tool, write <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>; '
        "the result comes back in <tool_response></tool_response>."
    )
    if name is not None:
        text += f"\nIn this reply you must call the tool {json.dumps(name)}."
    elif required:
        text += "\nIn this reply you must call at least one tool."
    return text


def _parse_one(raw: str) -> ToolCall | BadToolCall:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return BadToolCall(raw=raw[:200], error=f"the tool call is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    except (ValueError, RecursionError) as exc:  # an integer too long to convert, nesting deeper than the stack
        return BadToolCall(raw=raw[:200], error=f"the tool call is not usable JSON ({_json_limit(exc)})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return BadToolCall(raw=raw[:200], error='a tool call must be a JSON object {"name": "...", "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            return BadToolCall(raw=raw[:200], error="'arguments' is a string that is not valid JSON")
    if not isinstance(args, dict):
        return BadToolCall(raw=raw[:200], error="'arguments' must be a JSON object")
    return ToolCall(name=obj["name"], arguments=args)


def _json_limit(exc: ValueError | RecursionError) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(":")[0]
