"""OpenAI's Responses API (``POST /v1/responses``) in terms of the gateway's chat completions.

The OpenAI Agents SDK's default model class, and newer clients, call ``/v1/responses``. A request here becomes the
chat-completions call it means (:func:`chat_body`), which the gateway runs and records exactly like any other (the
same session, token continuity, tool-call parsing), and the chat completion becomes a Responses API ``response``
object (:func:`response_object`). What maps to what:

- ``instructions`` -> a first ``system`` message; ``input`` as a string -> one ``user`` message; input items:
  messages (``role`` user / system / developer / assistant; content a string or parts: ``input_text``,
  ``output_text``, ``refusal`` -> text, ``input_image`` with an ``image_url`` -> an image, ``input_audio`` ->
  audio; ``developer`` is ``system``), ``function_call`` -> the assistant's tool call (joined to the assistant
  message before it), ``function_call_output`` -> a ``tool`` message; ``reasoning`` items are dropped (the model's
  text holds what it thought);
- ``previous_response_id``: that response's whole conversation (its input, then its output) goes first; it must be
  a response of the same session (responses are kept in memory, the newest 4096);
- ``tools``: function tools only (``{"type": "function", "name", "description", "parameters", "strict"}``);
  ``tool_choice``: ``auto`` / ``none`` / ``required`` / ``{"type": "function", "name"}``;
- ``max_output_tokens`` -> ``max_completion_tokens``; ``temperature``, ``top_p``, ``user`` as in chat;
- the response: ``output`` holds an assistant ``message`` (``output_text``) when the reply has text, then one
  ``function_call`` item per tool call (``call_id`` = the chat tool call's id); ``status`` ``completed``, or
  ``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` when the length ran out; ``usage`` in
  input / output tokens; ``relax`` has the session, call index and weight version, as in chat.

The other way, :func:`to_responses_input` writes our messages as Responses API input (NeMo-Gym task rows), each
medium decoded by its own sampling spec first, so the other side gets what our policy would see: text as
``input_text``; an image as ``input_image`` with a PNG ``data:`` URL; a video as its sampled frames, each an
``input_text`` ``[video frame at T s]`` then an ``input_image`` (the API has no video part), and the clip's sound,
when sampled, after them; audio as ``input_audio`` with base64 16-bit WAV (``{"data", "format": "wav"}``: the Chat
Completions part; the Responses API defines none for audio, so a model server must accept this one); a ``tool``
message as a ``user`` one.

``stream: true`` is answered with the Responses API's events as the engine generates (the gateway's
:mod:`~relax_gym.trainer.gateway.live_stream`). Not served: built-in tools (web search, file search, computer use,
...), ``input_file`` and ``file_id`` images, ``conversation`` objects, ``background``. Accepted and ignored:
``include``, ``store``, ``metadata``, ``parallel_tool_calls``, ``service_tier``, ``prompt_cache_key``,
``safety_identifier``, ``truncation`` (``disabled`` / ``auto``), ``reasoning`` and ``text`` at their defaults.
"""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import soundfile
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relax_gym.omni.parts import AudioPart, ImagePart, Message, TextPart, VideoPart

from relax_gym.omni.request_errors import field_error

IGNORED = ("include", "store", "metadata", "parallel_tool_calls", "service_tier", "prompt_cache_key",
           "safety_identifier", "truncation", "reasoning", "text", "top_logprobs", "stream_options", "background",
           "prompt", "conversation", "max_tool_calls")


class ResponsesRequestError(ValueError):
    """A request this endpoint cannot serve; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses`` (the fields this endpoint reads; :data:`IGNORED` pass unread)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    stream: bool = False
    # accepted, not read (see IGNORED)
    include: Any = None
    store: Any = None
    metadata: Any = None
    parallel_tool_calls: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    truncation: Any = None
    reasoning: Any = None
    text: Any = None
    top_logprobs: Any = None
    stream_options: Any = None
    background: Any = None
    prompt: Any = None
    conversation: Any = None
    max_tool_calls: Any = None


def parse_request(body: Any) -> ResponsesRequest:
    """The request, or a :class:`ResponsesRequestError` naming the first field at fault."""
    if not isinstance(body, dict):
        raise ResponsesRequestError("the body must be a JSON object with 'model' and 'input'")
    try:
        req = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise ResponsesRequestError(*field_error(exc, "Responses API")) from None
    if req.background:
        raise ResponsesRequestError("background: true is not served (every response completes in its call)", "background")
    if req.conversation is not None:
        raise ResponsesRequestError("conversation objects are not served; use previous_response_id or send the "
                                    "whole input", "conversation")
    if req.truncation not in (None, "disabled", "auto"):
        raise ResponsesRequestError(f"truncation: {req.truncation!r} is not 'disabled' or 'auto'", "truncation")
    return req


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "input_image":
        if not isinstance(part.get("image_url"), str):
            raise ResponsesRequestError(f"{where}: input_image needs an image_url (a data: URL or a file:// path); "
                                        f"file_id images are not served", "input")
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio")}
    if kind in ("image_url", "audio_url", "video_url"):  # chat parts, as some task files hold them
        return part
    raise ResponsesRequestError(f"{where}: content part of type {kind!r} is not served (input_text, input_image, "
                                f"input_audio, output_text)", "input")


def _tool_output(output: Any, where: str) -> Any:
    """A ``function_call_output``'s ``output`` as a tool message's content: a string as it is; a list of parts
    (``input_text`` / ``input_image`` / ..., what e.g. the Agents SDK sends for a tool that returns
    ``ToolOutputImage``) as content parts, so its pictures reach the policy as pictures (text only: joined); any
    other JSON as its text."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        parts = [_part(p, f"{where}[{j}]") for j, p in enumerate(output)]
        return parts if any(p["type"] != "text" for p in parts) else "".join(p["text"] for p in parts)
    return json.dumps(output)


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``req``'s own input as chat messages (``instructions`` not included)."""
    return [{"role": "user", "content": req.input}] if isinstance(req.input, str) else chat_messages(req.input)


def chat_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Responses API input items as chat messages (a NeMo-Gym task row's ``input`` too); a
    :class:`ResponsesRequestError` names the item and part it cannot read."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ResponsesRequestError(f"{where}: not an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ResponsesRequestError(f"{where}.role: {role!r} is not user, system, developer or assistant", "input")
            content = item.get("content")
            if isinstance(content, list):
                content = [_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
                if role == "assistant":  # the chat API's assistant content is text
                    content = "".join(p.get("text", "") for p in content)
            elif not isinstance(content, str):
                raise ResponsesRequestError(f"{where}.content: must be a string or a list of parts", "input")
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": str(item.get("name") or ""), "arguments": str(item.get("arguments") or "{}")}}
            if not call["id"] or not call["function"]["name"]:
                raise ResponsesRequestError(f"{where}: a function_call needs call_id and name", "input")
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                        "content": _tool_output(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            continue
        else:
            raise ResponsesRequestError(f"{where}: items of type {kind!r} are not served (message, function_call, "
                                        f"function_call_output, reasoning)", "input")
    return out


def chat_tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """``tools`` and ``tool_choice`` in the chat API's shape."""
    tools = None
    if req.tools is not None:
        tools = []
        for i, tool in enumerate(req.tools):
            if tool.get("type") != "function":
                raise ResponsesRequestError(f"tools[{i}]: built-in tools ({tool.get('type')!r}) are not served; "
                                            f"function tools only", "tools")
            tools.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters",
                                                                               "strict") if tool.get(k) is not None}})
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not choice.get("name"):
            raise ResponsesRequestError("tool_choice: an object must be {'type': 'function', 'name': ...}", "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools or None, choice


def chat_body(req: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body ``req`` means, after ``history`` (the previous response's conversation)."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history \
        + input_messages(req)
    tools, choice = chat_tools(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    for key, value in (("tools", tools), ("tool_choice", choice), ("max_completion_tokens", req.max_output_tokens),
                       ("temperature", req.temperature), ("top_p", req.top_p), ("user", req.user)):
        if value is not None:
            body[key] = value
    return body


def continued_chat_body(req: ResponsesRequest, history_of: Callable[[str], list[dict[str, Any]] | None],
                        scope: str) -> dict[str, Any]:
    """The chat-completions body ``req`` means, continued after the conversation of its ``previous_response_id``
    when it names one. ``history_of(response_id)``: that conversation (:func:`conversation_after` of the earlier
    call), or None when it is not known in ``scope`` (e.g. ``"this session"``): one error naming the field.
    Raises :class:`ResponsesRequestError`."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        kept = history_of(req.previous_response_id)
        if kept is None:
            raise ResponsesRequestError(f"previous_response_id: no response {req.previous_response_id[:60]!r} in "
                                        f"{scope}", "previous_response_id")
        history = kept
    return chat_body(req, history)


def response_object(req: ResponsesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion (the gateway's) as a Responses API ``response``."""
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed",
                       "role": "assistant", "content": [{"type": "output_text", "text": message["content"],
                                                         "annotations": [], "logprobs": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()), "model": req.model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "instructions": req.instructions, "previous_response_id": req.previous_response_id,
        "output": output, "parallel_tool_calls": True, "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [], "temperature": req.temperature, "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "metadata": {}, "store": False, "reasoning": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "relax": chat.get("relax", {}),
    }


def conversation_after(req: ResponsesRequest, body: dict[str, Any], chat: dict[str, Any]) -> list[dict[str, Any]]:
    """What a later ``previous_response_id`` continues: the call's chat messages (without its ``instructions``
    message: as in OpenAI's API, a later call brings its own) and the reply as an assistant message."""
    message = {k: v for k, v in chat["choices"][0]["message"].items() if k in ("role", "content", "tool_calls")}
    return [*body["messages"][1 if req.instructions else 0:], message]


# ---------------------------------------------------------------------------------- our messages, theirs


def _png_url(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _audio_part(waveform: np.ndarray, sample_rate: int) -> dict[str, Any]:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.asarray(waveform, dtype=np.float32), sample_rate, format="WAV", subtype="PCM_16")
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(buffer.getvalue()).decode(), "format": "wav"}}


def _parts(part: Any) -> list[dict[str, Any]]:
    if isinstance(part, TextPart):
        return [{"type": "input_text", "text": part.text}]
    if isinstance(part, ImagePart):
        return [{"type": "input_image", "image_url": _png_url(part.decode()), "detail": "auto"}]
    if isinstance(part, VideoPart):
        video = part.decode()
        out: list[dict[str, Any]] = []
        for t, frame in zip(video.timestamps, video.frames):
            out += [{"type": "input_text", "text": f"[video frame at {float(t):.2f} s]"},
                    {"type": "input_image", "image_url": _png_url(frame), "detail": "auto"}]
        if video.audio is not None:
            out.append(_audio_part(video.audio.waveform, video.audio.sample_rate))
        return out
    if isinstance(part, AudioPart):
        audio = part.decode()
        return [_audio_part(audio.waveform, audio.sample_rate)]
    raise TypeError(f"unknown part {type(part).__name__}")


def to_responses_input(messages: list[Message] | tuple[Message, ...]) -> list[dict[str, Any]]:
    """``messages`` as Responses API input messages, media decoded and inline."""
    items = []
    for message in messages:
        role = "user" if message.role == "tool" else message.role
        content = [p for part in message.content for p in _parts(part)]
        if role == "assistant":  # earlier assistant turns are output text in the Responses API
            content = [{"type": "output_text", "text": p["text"]} if p["type"] == "input_text" else p for p in content]
        items.append({"type": "message", "role": role, "content": content})
    return items
