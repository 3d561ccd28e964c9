"""JSON round-trip of conversations in OpenAI-style content parts.

Text: ``{"type": "text", "text": ...}``; image: ``{"type": "image_url", "image_url": {"url": ...}}``; video:
``{"type": "video_url", "video_url": {"url": ...}}`` (the vLLM / SGLang extension); audio from a file:
``{"type": "audio_url", "audio_url": {"url": ...}}``, audio from a buffer: ``{"type": "input_audio",
"input_audio": {"data": <base64>, "format": "wav"}}``. Files are ``file://`` URLs, buffers and arrays are
``data:`` URLs (arrays as ``.npy``). Each media part also carries its sampling spec under ``"sampling"`` so the
round trip is exact.
"""

from __future__ import annotations

import base64
import io
import json
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
from pydantic import ValidationError

from relax_gym.omni.parts import AudioPart, ImagePart, Message, Part, TextPart, VideoPart
from relax_gym.omni.sampling import AudioSampling, ImageSampling, VideoSampling
from relax_gym.omni.source import MediaSource

_NPY_MIME = "application/x-npy"
_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/flac": "flac", "audio/mpeg": "mp3", "audio/ogg": "ogg"}


class ConversationFormatError(ValueError):
    """A conversation in JSON form is malformed; the message names the message and part index."""


def to_openai(messages: list[Message] | tuple[Message, ...]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "content": [_part_to_json(p) for p in m.content]}
        if m.name is not None:
            item["name"] = m.name
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        out.append(item)
    return out


def from_openai(items: list[dict[str, Any]]) -> list[Message]:
    if not isinstance(items, list):
        raise ConversationFormatError(f"a conversation must be a JSON list of messages, got {type(items).__name__}")
    messages = []
    for i, item in enumerate(items):
        where = f"message {i}"
        if not isinstance(item, dict) or "role" not in item or "content" not in item:
            raise ConversationFormatError(f"{where}: needs 'role' and 'content'")
        content = item["content"]
        if isinstance(content, str):
            parts: list[Part] = [TextPart(content)]
        elif isinstance(content, list):
            parts = [_part_from_json(p, f"{where}, part {j}") for j, p in enumerate(content)]
        else:
            raise ConversationFormatError(f"{where}: 'content' must be a string or a list of parts")
        try:
            messages.append(Message(role=item["role"], content=tuple(parts), name=item.get("name"), tool_call_id=item.get("tool_call_id")))
        except ValueError as exc:
            raise ConversationFormatError(f"{where}: {exc}") from exc
    return messages


def dumps(messages: list[Message] | tuple[Message, ...], **kwargs: Any) -> str:
    return json.dumps(to_openai(messages), **kwargs)


def loads(text: str) -> list[Message]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConversationFormatError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except RecursionError:
        raise ConversationFormatError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer longer than Python converts
        raise ConversationFormatError(f"invalid JSON: {str(exc).split(':')[0]}") from None
    return from_openai(data)


# ---------------------------------------------------------------------------------------------- parts


def _part_to_json(part: Part) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    sampling = part.sampling.model_dump(mode="json")
    url = _source_url(part.source)
    if isinstance(part, ImagePart):
        return {"type": "image_url", "image_url": {"url": url}, "sampling": sampling}
    if isinstance(part, VideoPart):
        return {"type": "video_url", "video_url": {"url": url}, "sampling": sampling}
    src = part.source
    if src.data is not None and src.guess_mime() in _AUDIO_FORMATS:
        payload = {"data": base64.b64encode(src.data).decode(), "format": _AUDIO_FORMATS[src.guess_mime()]}
        return {"type": "input_audio", "input_audio": payload, "sampling": sampling}
    return {"type": "audio_url", "audio_url": {"url": url}, "sampling": sampling}


def _source_url(src: MediaSource) -> str:
    if src.path is not None:
        return src.path.as_uri()
    if src.data is not None:
        return f"data:{src.guess_mime() or 'application/octet-stream'};base64,{base64.b64encode(src.data).decode()}"
    rate = f";rate={src.rate}" if src.rate is not None else ""
    return f"data:{_NPY_MIME}{rate};base64,{base64.b64encode(src.npy_bytes()).decode()}"


_PART_TYPES = {
    "image_url": (ImagePart, ImageSampling, "image_url"),
    "video_url": (VideoPart, VideoSampling, "video_url"),
    "audio_url": (AudioPart, AudioSampling, "audio_url"),
}


def _part_from_json(obj: Any, where: str) -> Part:
    if not isinstance(obj, dict) or "type" not in obj:
        raise ConversationFormatError(f"{where}: a part must be an object with a 'type'")
    kind = obj["type"]
    if kind == "text":
        if not isinstance(obj.get("text"), str):
            raise ConversationFormatError(f"{where}: text part needs a string 'text'")
        return TextPart(obj["text"])
    if kind == "input_audio":
        payload = obj.get("input_audio") or {}
        try:
            data = base64.b64decode(payload["data"], validate=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConversationFormatError(f"{where}: input_audio.data must be base64") from exc
        fmt = payload.get("format", "wav")
        mime = next((m for m, f in _AUDIO_FORMATS.items() if f == fmt), None)
        return AudioPart(MediaSource(data=data, mime=mime), _sampling(AudioSampling, obj, where))
    if kind not in _PART_TYPES:
        raise ConversationFormatError(f"{where}: unknown part type {kind!r} (known: text, {', '.join(_PART_TYPES)}, input_audio)")
    cls, spec_cls, key = _PART_TYPES[kind]
    url = (obj.get(key) or {}).get("url") if isinstance(obj.get(key), dict) else None
    if not isinstance(url, str):
        raise ConversationFormatError(f"{where}: {key}.url must be a string")
    return cls(_source_from_url(url, where), _sampling(spec_cls, obj, where))


def _sampling(spec_cls, obj: dict[str, Any], where: str):
    try:
        return spec_cls(**(obj.get("sampling") or {}))
    except (ValidationError, TypeError) as exc:
        raise ConversationFormatError(f"{where}: bad sampling: {exc}") from exc


def _source_from_url(url: str, where: str) -> MediaSource:
    if url.startswith("data:"):
        header, sep, body = url[5:].partition(",")
        if not sep or not header.endswith(";base64"):
            raise ConversationFormatError(f"{where}: only base64 data: URLs are supported")
        fields = header[: -len(";base64")].split(";")
        mime, params = fields[0], dict(f.split("=", 1) for f in fields[1:] if "=" in f)
        try:
            data = base64.b64decode(body, validate=True)
        except ValueError as exc:
            raise ConversationFormatError(f"{where}: data URL is not valid base64") from exc
        if mime == _NPY_MIME:
            # MemoryError: a header may claim more elements than memory holds (the data behind it is never that long)
            try:
                array = np.load(io.BytesIO(data), allow_pickle=False)
            except (ValueError, EOFError, OSError, zipfile.BadZipFile, MemoryError) as exc:
                raise ConversationFormatError(f"{where}: data URL holds no valid .npy array ({exc})") from exc
            if not isinstance(array, np.ndarray):
                raise ConversationFormatError(f"{where}: data URL holds an .npz archive, not one .npy array")
            try:
                rate = float(params["rate"]) if "rate" in params else None
            except ValueError:
                raise ConversationFormatError(f"{where}: data URL rate={params['rate']!r} is not a number") from None
            return MediaSource(array=array, rate=rate)
        return MediaSource(data=data, mime=mime or None)
    try:
        parsed = urlparse(url)
    except ValueError as exc:  # e.g. an unclosed "[" in the host
        raise ConversationFormatError(f"{where}: malformed URL ({exc})") from None
    if parsed.scheme == "file":
        return MediaSource(path=Path(unquote(parsed.path)))
    if parsed.scheme == "":
        return MediaSource(path=Path(url))
    raise ConversationFormatError(f"{where}: unsupported URL scheme {parsed.scheme!r} (relax-gym never downloads media; use file:// or data:)")
