"""Messages as the OpenAI Responses API's input items (what a NeMo-Gym task row's ``responses_create_params.input``
holds), and back to OpenAI chat messages.

Ours to theirs (:func:`to_responses_input`), each medium decoded by its own sampling spec first, so the other side
gets what our policy would see:

- text: ``input_text``;
- an image: ``input_image`` with a PNG ``data:`` URL (``detail: "auto"``);
- a video: the sampled frames, each an ``input_text`` ``[video frame at T s]`` then an ``input_image`` (the
  Responses API has no video part), and the clip's sound, when sampled, as audio after them;
- audio: ``input_audio`` with base64 16-bit WAV (``{"data", "format": "wav"}``: the Chat Completions part; the
  Responses API defines none for audio, so a model server must accept this one);
- a ``tool`` message (never in an opening of ours, but possible in a later turn) becomes a ``user`` message.

Theirs to ours (:func:`chat_from_responses_input`): ``input_text`` / ``output_text`` to text, ``input_image`` to
``image_url``, ``input_audio`` as it is; plain string contents and chat parts pass through; anything else is one
error naming the item and the part.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import soundfile
from PIL import Image

from relax_gym.omni import Message
from relax_gym.omni.parts import AudioPart, ImagePart, TextPart, VideoPart


class ResponsesInputError(ValueError):
    """A Responses API input item we cannot read; the message names the item and part."""


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


def _chat_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise ResponsesInputError(f"{where}: input_image without an image_url (file_id images are not read)")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind in ("input_audio", "image_url", "audio_url", "video_url"):
        return part
    raise ResponsesInputError(f"{where}: a part of type {kind!r} (known: input_text, output_text, input_image, "
                              f"input_audio)")


def chat_from_responses_input(items: list[Any]) -> list[dict[str, Any]]:
    """Responses API input messages as OpenAI chat messages (``developer`` becomes ``system``)."""
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type", "message") != "message" or "role" not in item:
            raise ResponsesInputError(f"input item {i}: not a message with a role")
        role = "system" if item["role"] == "developer" else item["role"]
        content = item.get("content")
        if isinstance(content, list):
            content = [_chat_part(p, f"input item {i}, part {j}") for j, p in enumerate(content)]
        messages.append({"role": role, "content": content})
    return messages
