"""Tools for agent environments: a ``@tool`` decorator that derives the JSON schema from the signature and
docstring, parsing of Qwen/Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, and tool
results as ``<tool_response>`` messages. The text format itself (parsing, the instructions) lives in
:mod:`relax_gym.omni.tool_calls`, shared with the OpenAI endpoint; this module re-exports its names.

Nothing the model writes raises: a malformed call, an unknown tool, bad arguments or a tool that fails all become
an error text returned to the model as the tool's response, and the episode goes on.

Tools may return media. A tool's result is a ``str``, a :class:`ToolOutput` (text plus media parts), a single
media part (``ImagePart`` / ``VideoPart`` / ``AudioPart``) or a list mixing text and parts; :meth:`ToolBox.run`
turns each into a ``ToolOutput`` and decodes every media part once (through the shared decode cache), so media
that cannot be decoded (a span past the end of a file, a corrupt buffer) come back as a tool error the model can
read, instead of failing later when the conversation is rendered. :func:`tool_messages` puts the result into the
conversation: media inside the ``tool`` message (the default), or, for chat templates that show tool turns as
text only, in a ``user`` message right after it. Either way they are ordinary parts of the conversation, so every
later turn keeps them.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError, create_model

from relax_gym.omni import MediaError, Message, TextPart
from relax_gym.omni.parts import AudioPart, ImagePart, Part, VideoPart
from relax_gym.omni.tool_calls import (
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    BadToolCall,
    ToolCall,
    parse_tool_calls,
    tools_instructions,
)
from relax_gym.sandbox import SandboxUnavailable

log = logging.getLogger(__name__)
_REPORTED: set[tuple[str, str]] = set()

__all__ = [
    "BadToolCall", "MediaRole", "Tool", "ToolBox", "ToolCall", "ToolError", "ToolOutput", "parse_tool_calls", "tool",
    "tool_message", "tool_messages", "tools_system_prompt",
]

MediaRole = Literal["tool", "user"]
_MEDIA_TYPES = (ImagePart, VideoPart, AudioPart)

_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


class ToolError(Exception):
    """Raised by a tool to send a clean error message back to the model (no traceback)."""


@dataclass
class ToolOutput:
    """What a tool returns: text and/or media parts (e.g. a zoomed image)."""

    text: str = ""
    parts: list[Part] = field(default_factory=list)
    is_error: bool = False
    traceback: str = ""  # a tool that raised (a bug, not a ToolError): the traceback, for the env author, never the model


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    _model: Any = field(repr=False, default=None)

    def schema(self) -> dict[str, Any]:
        """OpenAI / Qwen function-calling schema."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        model = self._model.model_validate(arguments)
        return {k: getattr(model, k) for k in type(model).model_fields}


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Make a :class:`Tool` from a function. Parameter types come from annotations, descriptions from the
    docstring's ``Args:`` section; parameters without a default are required. A leading ``ctx`` parameter (if
    present) receives the environment's context and is not part of the schema."""

    def build(f: Callable[..., Any]) -> Tool:
        doc = inspect.getdoc(f) or ""
        summary, arg_docs = _parse_docstring(doc)
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(f).parameters.items():
            if pname == "ctx":
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {f.__name__}: *args/**kwargs cannot be described by a schema")
            if param.annotation is param.empty:
                raise TypeError(f"tool {f.__name__}: parameter {pname!r} needs a type annotation")
            annotation = param.annotation
            if isinstance(annotation, str):  # `from __future__ import annotations`; ctx is skipped, so no forward refs
                annotation = eval(annotation, f.__globals__)  # noqa: S307 - the tool author's own annotation
            default = ... if param.default is param.empty else param.default
            fields[pname] = (annotation, default)
        model = create_model(f"{f.__name__}_args", __config__={"extra": "forbid"}, **fields)
        schema = model.model_json_schema()
        props = {k: {kk: vv for kk, vv in v.items() if kk != "title"} for k, v in schema.get("properties", {}).items()}
        for pname, text in arg_docs.items():
            if pname in props:
                props[pname]["description"] = text
        params = {"type": "object", "properties": props, "required": schema.get("required", [])}
        return Tool(name=name or f.__name__, description=summary, parameters=params, fn=f, _model=model)

    return build(fn) if fn is not None else build


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    summary_lines, args, in_args, current = [], {}, False, None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            if not stripped:
                continue
            if stripped.endswith(":") and not line.startswith(" "):
                in_args = False  # next section (Returns:, ...)
                continue
            m = _ARG_LINE.match(line)
            if m and (line.startswith("    ") and not line.startswith("        ")):
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current:
                args[current] += " " + stripped
        elif not args:
            summary_lines.append(stripped)
    return " ".join(s for s in summary_lines if s).strip(), args


# ---------------------------------------------------------------------------------------------- running


class ToolBox:
    """The tools of one environment, run by name with validated arguments."""

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    def run(self, call: ToolCall | BadToolCall, ctx: Any = None) -> ToolOutput:
        if isinstance(call, BadToolCall):
            return ToolOutput(text=f"Error: {call.error}.", is_error=True)
        found = self.tools.get(call.name)
        if found is None:
            return ToolOutput(text=f"Error: unknown tool {call.name!r}; available: {', '.join(self.tools)}.", is_error=True)
        try:
            args = found.validate(call.arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return ToolOutput(text=f"Error: bad arguments for {call.name}: {problems}.", is_error=True)
        try:
            takes_ctx = "ctx" in inspect.signature(found.fn).parameters
            result = found.fn(ctx, **args) if takes_ctx else found.fn(**args)
        except ToolError as exc:
            return ToolOutput(text=f"Error: {exc}", is_error=True)
        except SandboxUnavailable:  # no sandbox backend on this machine: not the agent's doing nor a tool bug
            raise
        except Exception as exc:  # a tool bug must not end the episode loop; the model sees a terse error
            tb = traceback.format_exc()
            if (call.name, type(exc).__name__) not in _REPORTED:  # once per tool and kind of failure per process
                _REPORTED.add((call.name, type(exc).__name__))
                where = traceback.extract_tb(exc.__traceback__)[-1]
                log.warning("tool %s raised %s: %s (at %s:%d; the episode goes on and the model sees an error; later "
                            "failures of this kind are only counted, in tool_crashes)", call.name, type(exc).__name__,
                            exc, where.filename, where.lineno)
            return ToolOutput(text=f"Error: tool {call.name} failed: {type(exc).__name__}: {exc}", is_error=True,
                              traceback=tb)
        try:
            output = _as_output(result)
        except TypeError as exc:
            return ToolOutput(text=f"Error: tool {call.name} failed: {exc}", is_error=True)
        return _decoded(output, call.name)


def _as_output(result: Any) -> ToolOutput:
    """A tool's return value as a ToolOutput: text, one media part, or a list of text and media parts."""
    if isinstance(result, ToolOutput):
        return result
    if isinstance(result, str):
        return ToolOutput(text=result)
    if isinstance(result, _MEDIA_TYPES):
        return ToolOutput(parts=[result])
    if isinstance(result, list | tuple) and any(isinstance(r, _MEDIA_TYPES) for r in result):
        texts, parts = [], []
        for item in result:
            if isinstance(item, str | TextPart):
                texts.append(item if isinstance(item, str) else item.text)
            elif isinstance(item, _MEDIA_TYPES):
                parts.append(item)
            else:
                raise TypeError(f"returned a list holding a {type(item).__name__} (only text and media parts go in one)")
        return ToolOutput(text="\n".join(texts), parts=parts)
    return ToolOutput(text=json.dumps(result))


def _decoded(output: ToolOutput, name: str) -> ToolOutput:
    """Decode each media part now (results are cached for the renderer); an undecodable one is a tool error."""
    for part in output.parts:
        try:
            part.decode()
        except MediaError as exc:
            return ToolOutput(text=f"Error: tool {name} returned {part.kind} that cannot be decoded: {exc.reason}", is_error=True)
    return output


def tool_message(output: ToolOutput, call: ToolCall | BadToolCall) -> Message:
    """A ``tool`` message wrapping the result in ``<tool_response>`` (media parts kept inside, in order)."""
    name = call.name if isinstance(call, ToolCall) else None
    body = [TextPart(TOOL_RESPONSE_OPEN + output.text)]
    body += output.parts
    body.append(TextPart(TOOL_RESPONSE_CLOSE))
    return Message(role="tool", content=tuple(body), name=name)


def tool_messages(output: ToolOutput, call: ToolCall | BadToolCall, *, media_role: MediaRole = "tool") -> list[Message]:
    """The messages a tool result adds to the conversation. ``media_role="tool"``: one ``tool`` message with the
    media inside its ``<tool_response>``; ``"user"``: the ``tool`` message carries the text and the media follow
    in a ``user`` message (for chat templates that render tool turns as plain text)."""
    if media_role not in ("tool", "user"):
        raise ValueError(f"media_role must be 'tool' or 'user', got {media_role!r}")
    if media_role == "tool" or not output.parts:
        return [tool_message(output, call)]
    name = call.name if isinstance(call, ToolCall) else "the tool"
    kinds = ", ".join(p.kind for p in output.parts)
    text_only = ToolOutput(text=f"{output.text}\n({kinds} in the next message)".lstrip("\n"), is_error=output.is_error)
    media = Message(role="user", content=(TextPart(f"Media returned by {name}:"), *output.parts))
    return [tool_message(text_only, call), media]


def tools_system_prompt(toolbox: ToolBox) -> str:
    """Qwen/Hermes-style tool instructions listing each tool's schema
    (:func:`relax_gym.omni.tool_calls.tools_instructions`)."""
    return tools_instructions(toolbox.schemas())
