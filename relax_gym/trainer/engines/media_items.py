"""Media items of a ``/generate`` request (``image_data`` / ``video_data`` / ``audio_data``): a URL and our relax
sampling spec (:mod:`relax_gym.trainer.engines.protocol` explains the format), and the items of a conversation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from relax_gym.trainer.engines.validation import format_validation_error

MEDIA_FIELDS: dict[str, str] = {"image_data": "image", "video_data": "video", "audio_data": "audio"}


class MediaItem(BaseModel):
    """One media item: a URL (``file://``, ``data:``, a plain path) and our relax sampling spec (see module doc)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1)
    sampling: dict[str, Any] | None = None
    detail: str | None = None  # SGLang / OpenAI image detail: accepted, ignored

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        low = v[:8].lower()
        if low.startswith(("http://", "https://")):
            raise ValueError("http(s) URLs are not fetched (relax-gym never downloads media); use file://, data: or a path")
        return v


def _media_item(value: Any, where: str) -> MediaItem:
    if isinstance(value, str | Mapping):
        try:
            return MediaItem.model_validate({"url": value} if isinstance(value, str) else dict(value))
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, where)) from None
    raise ValueError(f"{where}: a media item must be a URL string or {{'url': ..., 'sampling': {{...}}}}, got {type(value).__name__}")


def _media_list(value: Any, where: str) -> list[MediaItem]:
    """One request's items: None, an item, or a list of items."""
    if value is None:
        return []
    if isinstance(value, list):
        return [_media_item(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return [_media_item(value, where)]


def media_item(part: Any) -> dict[str, Any]:
    """A relax_gym media part (:class:`~relax_gym.omni.ImagePart` / ``VideoPart`` / ``AudioPart``) as a request
    item ``{"url": ..., "sampling": {...}}`` (files as ``file://`` URLs, buffers and arrays as ``data:`` URLs)."""
    from relax_gym.omni import Message, to_openai

    (js,) = to_openai([Message("user", (part,))])[0]["content"]
    sampling = js.get("sampling")
    if js["type"] == "input_audio":
        payload = js["input_audio"]
        mime = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "ogg": "audio/ogg"}.get(payload.get("format", "wav"), "audio/wav")
        return {"url": f"data:{mime};base64,{payload['data']}", "sampling": sampling}
    return {"url": js[js["type"]]["url"], "sampling": sampling}


def media_data(messages: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """The ``image_data`` / ``video_data`` / ``audio_data`` of a conversation, items in conversation order (the
    order ``render`` expands them in). Only kinds that occur are returned: ``generate(..., **media_data(obs))``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for message in messages:
        for part in message.media():
            out.setdefault(f"{part.kind}_data", []).append(media_item(part))
    return out
