"""SGLang's native HTTP protocol as pydantic models: ``/generate`` requests and responses, and the weight / admin
requests an RL trainer sends to a rollout engine. Field names, defaults and response shapes are SGLang's
(``python/sglang/srt/managers/io_struct.py``, ``python/sglang/srt/entrypoints/http_server.py``), so the same
client code drives a real SGLang server and :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine`.

Generate request (single or batch, as in SGLang)::

    {"input_ids": [1, 2, 3],                # or "text": "...";  batch: [[...], [...]] / ["...", "..."]
     "sampling_params": {"max_new_tokens": 32, "temperature": 0.7, "stop": ["</answer>"]},   # batch: dict or list
     "image_data": ["file:///x.jpg", {"url": "data:image/png;base64,...", "sampling": {"max_pixels": 50176}}],
     "return_logprob": true}

Media items (``image_data`` / ``video_data`` / ``audio_data``): per request a list of items (or a single item), per
batch a list with one such entry per request. An item is a URL string -- ``file://...``, ``data:<mime>;base64,...``
(``application/x-npy`` arrays too) or a plain local path -- or **our extension**, a dict
``{"url": <that string>, "sampling": {...}}`` whose ``sampling`` is relax_gym's sampling spec of that kind
(:class:`~relax_gym.omni.ImageSampling`, :class:`~relax_gym.omni.VideoSampling`,
:class:`~relax_gym.omni.AudioSampling`: frame rate and budget, pixel budget, audio span / rate). A bare string is
decoded with the kind's default spec. The engine decodes an item exactly as ``relax_gym.omni.render`` does for the
part ``{"type": "<kind>_url", "<kind>_url": {"url": ...}, "sampling": ...}`` (:func:`relax_gym.omni.from_openai`),
so sending the spec the conversation was rendered with reproduces the rendered media tensors bit for bit;
:func:`media_data` builds these items from conversation messages. SGLang's ``{"url": ..., "detail": ...}`` image
items are accepted (``detail`` ignored). ``http(s)://`` URLs are refused (relax-gym never downloads media).

Response (a list of these for a batch request)::

    {"text": "...", "output_ids": [...],
     "meta_info": {"id": "...", "finish_reason": {"type": "stop", "matched": 2},   # or "length" / "abort"
                   "prompt_tokens": 57, "completion_tokens": 9, "cached_tokens": 0,
                   "output_token_logprobs": [[-0.11, 412, null], ...], "weight_version": "3", "e2e_latency": 0.2}}

With ``"return_routed_experts": true`` (an MoE model) ``meta_info`` also holds SGLang's ``routed_experts`` (base64
of the ``(prompt_tokens + completion_tokens - 1, layers, top_k)`` expert ids, row-major) and
``routed_experts_dtype`` (``uint8`` / ``uint16`` / ``int32``); :mod:`relax_gym.trainer.policy.routing` encodes and decodes
them. A dense model refuses the flag (400).

Tensor payloads (``update_weights_from_tensor``): SGLang's ``serialized_named_tensors`` holds one string per
tensor-parallel rank, each SGLang's own ``MultiprocessingSerializer`` output (a pickle of CUDA IPC handles, base64
in JSON): it only works for a trainer on the same host as a real SGLang server and is never unpickled here. **Our
wire format** for each string is base64 of a safetensors file holding the named tensors
(:func:`serialize_named_tensors` / :func:`deserialize_named_tensors`); against a real SGLang server a trainer must
use ``update_weights_from_disk`` or the distributed path instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from relax_gym.trainer.engines.media_items import MEDIA_FIELDS, MediaItem, _media_list
from relax_gym.trainer.engines.validation import format_validation_error

__all__ = ["EngineRequest", "FinishReason", "GenerateReqInput", "GenerateResponse", "MetaInfo", "SamplingParams",
           "check_stop", "check_top_k"]


def _check_neutral(name: str, value: Any, default: Any) -> Any:
    """Accept a known SGLang field only at its neutral value (empty containers and null count as unset)."""
    if value == default or value is None or value in ({}, []):
        return value
    raise ValueError(f"{name}={_short(value)} is not supported by the embedded engine (only {default!r})")


# SamplingParams fields the embedded engine implements only at their neutral value.
_SAMPLING_NEUTRAL: dict[str, Any] = {
    "min_new_tokens": 0, "stop_regex": None, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "n": 1, "regex": None, "json_schema": None, "ebnf": None, "structural_tag": None,
    "logit_bias": None, "custom_params": None, "sampling_seed": None,
}


# ------------------------------------------------------------------------------------------------ sampling


def check_top_k(v: int) -> int:
    """``top_k``: -1 (disabled) or at least 1 (shared by SGLang's sampling params and the OpenAI request)."""
    if v != -1 and v < 1:
        raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {v}")
    return v


def check_stop(v: str | list[str] | None) -> str | list[str] | None:
    """``stop``: no empty stop string (it would match everywhere)."""
    if any(s == "" for s in ([v] if isinstance(v, str) else v or [])):
        raise ValueError("stop strings must be non-empty")
    return v

class SamplingParams(BaseModel):
    """SGLang's ``sampling_params`` (``python/sglang/srt/sampling/sampling_params.py``), same names and defaults.

    Implemented: ``max_new_tokens``, ``stop`` (strings, matched on the decoded completion), ``stop_token_ids``,
    ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 = off), ``min_p``, ``ignore_eos``, ``skip_special_tokens``,
    ``no_stop_trim``, ``n`` (must be 1). SGLang's other fields are accepted only at their neutral value (a clear
    error names the field otherwise); unknown fields are refused, as SGLang's ``SamplingParams(**d)`` does."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=128, ge=0)
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[str, float] | None = None
    custom_params: dict[str, Any] | None = None
    sampling_seed: int | None = None
    stream_interval: int | None = None

    @field_validator(*_SAMPLING_NEUTRAL)
    @classmethod
    def _neutral(cls, value: Any, info: ValidationInfo) -> Any:
        return _check_neutral(info.field_name, value, _SAMPLING_NEUTRAL[info.field_name])

    _top_k = field_validator("top_k")(classmethod(lambda cls, v: check_top_k(v)))
    _stop = field_validator("stop")(classmethod(lambda cls, v: check_stop(v)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def warper_key(self) -> tuple:
        """What must be identical for two requests to share one ``model.generate`` call (the logits warpers);
        stopping, lengths and decoding options are per request."""
        if self.greedy:
            return ("greedy",)
        return ("sample", self.temperature, self.top_p, self.top_k, self.min_p)


# ------------------------------------------------------------------------------------------------ generate


class EngineRequest(BaseModel):
    """One normalised generate request (a batch request splits into several)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rid: str
    input_ids: list[int] | None = None
    text: str | None = None
    media: dict[str, list[MediaItem]] = Field(default_factory=dict)  # kind -> items
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    return_routed_experts: bool = False
    index: int = 0  # position in its batch (error messages)

    @property
    def where(self) -> str:
        return f"request {self.index} (rid {self.rid})"


# SGLang fields the embedded engine implements only at their neutral value.
_NEUTRAL_FIELDS: dict[str, Any] = {
    "input_embeds": None, "lora_path": None, "session_params": None, "custom_logit_processor": None,
    "token_ids_logprob": None, "return_hidden_states": False, "background": False,
    "use_audio_in_video": False, "video_config": None, "images_config": None, "return_entropy": False,
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None, "bootstrap_pair_key": None,
    "positional_embed_overrides": None, "max_thinking_tokens": None, "return_sampling_mask": None,
    "return_flat_raw_top_logprobs": False, "return_flat_raw_top_logprobs_b64": False, "return_indexer_topk": False,
    "return_prompt_token_ids": False, "kv_router_hint": None, "multi_item_delimiter_indices": None,
}


class GenerateReqInput(BaseModel):
    """SGLang's ``GenerateReqInput`` (the ``/generate`` body), single or batch. Exactly one of ``text`` /
    ``input_ids``. ``input_ids`` must already hold each media item's expanded pad tokens (as ``render`` writes
    them); ``text`` may hold one placeholder per item, which the engine expands. ``stream=true`` (one request, not a
    batch) answers Server-Sent Events as the tokens are sampled, in SGLang's format (cumulative ``text`` and
    ``output_ids`` in each event, the whole response last, then ``[DONE]``); ``logprob_start_len`` must be -1 / null
    (no prompt log-probs).
    Known SGLang fields without meaning here are accepted (ignored, or only at their neutral value); unknown
    fields are an error naming them."""

    model_config = ConfigDict(extra="forbid")

    text: Any = None
    input_ids: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    sampling_params: Any = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    return_routed_experts: bool | list[bool] | None = None  # MoE models: meta_info.routed_experts (see trainer/routing.py)
    stream: bool = False
    rid: str | list[str] | None = None

    # known SGLang fields, accepted and ignored
    session_id: Any = None
    modalities: Any = None
    log_metrics: Any = None
    custom_labels: Any = None
    priority: Any = None
    extra_key: Any = None
    routing_key: Any = None
    conversation_id: Any = None
    data_parallel_rank: Any = None
    routed_dp_rank: Any = None
    disagg_prefill_dp_rank: Any = None
    no_logs: Any = None
    mm_hashes: Any = None
    mm_content_hashes: Any = None
    received_time: Any = None
    external_trace_header: Any = None
    require_reasoning: Any = None
    http_worker_ipc: Any = None
    return_bytes: Any = None
    cache_salt: Any = None
    lora_id: Any = None
    # known SGLang fields, accepted only at their neutral value
    input_embeds: Any = None
    lora_path: Any = None
    session_params: Any = None
    custom_logit_processor: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: Any = None
    background: Any = None
    use_audio_in_video: Any = None
    video_config: Any = None
    images_config: Any = None
    return_entropy: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    bootstrap_pair_key: Any = None
    positional_embed_overrides: Any = None
    max_thinking_tokens: Any = None
    return_sampling_mask: Any = None
    return_flat_raw_top_logprobs: Any = None
    return_flat_raw_top_logprobs_b64: Any = None
    return_indexer_topk: Any = None
    return_prompt_token_ids: Any = None
    kv_router_hint: Any = None
    multi_item_delimiter_indices: Any = None

    @field_validator(*_NEUTRAL_FIELDS)
    @classmethod
    def _neutral(cls, value: Any, info: ValidationInfo) -> Any:
        return _check_neutral(info.field_name, value, _NEUTRAL_FIELDS[info.field_name])

    @model_validator(mode="after")
    def _check(self) -> GenerateReqInput:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text / input_ids (input_embeds is not supported)")
        n = self.batch_size
        if n is not None and n == 0:
            raise ValueError("a batch request needs at least one prompt")
        if self.stream and n is not None:
            raise ValueError(f"stream=True takes one request, not a batch of {n} (send them one by one to stream each)")
        count = n or 1
        for name in ("return_logprob", "logprob_start_len", "top_logprobs_num", "rid", "return_routed_experts"):
            value = getattr(self, name)
            if isinstance(value, list) and (n is None or len(value) != n):
                raise ValueError(f"{name}: a list needs one entry per request of a batch ({count}), got {len(value)}")
        for i in range(count):
            start = self._at("logprob_start_len", i)
            if start is not None and start != -1:
                raise ValueError(f"logprob_start_len={start}: prompt log-probs are not supported by the embedded engine (use -1)")
            top = self._at("top_logprobs_num", i)
            if top is not None and top < 0:
                raise ValueError(f"top_logprobs_num must be >= 0, got {top}")
        self.sampling_list()  # validates
        for field in MEDIA_FIELDS:
            self.media_lists(field)
        return self

    @field_validator("text")
    @classmethod
    def _text(cls, v: Any) -> Any:
        if v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(t, str) for t in v)):
            return v
        raise ValueError("text must be a string or a list of strings")

    @field_validator("input_ids")
    @classmethod
    def _input_ids(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, list):
            raise ValueError("input_ids must be a list of token ids or a list of such lists")
        if all(_is_int(t) for t in v):
            if not v:
                raise ValueError("input_ids must not be empty")
            return [int(t) for t in v]
        if all(isinstance(row, list) for row in v):
            for i, row in enumerate(v):
                if not row or not all(_is_int(t) for t in row):
                    raise ValueError(f"input_ids[{i}] must be a non-empty list of integer token ids")
            return [[int(t) for t in row] for row in v]
        raise ValueError("input_ids must be a list of integer token ids or a list of such lists (not a mix)")

    @property
    def batch_size(self) -> int | None:
        """None for a single request, else the number of prompts."""
        if isinstance(self.text, list):
            return len(self.text)
        if isinstance(self.input_ids, list) and self.input_ids and isinstance(self.input_ids[0], list):
            return len(self.input_ids)
        return None

    @property
    def is_batch(self) -> bool:
        return self.batch_size is not None

    def _at(self, name: str, i: int) -> Any:
        value = getattr(self, name)
        return value[i] if isinstance(value, list) else value

    def sampling_list(self) -> list[SamplingParams]:
        n = self.batch_size
        count = n or 1
        raw = self.sampling_params
        if raw is None:
            raw = {}
        if isinstance(raw, list):
            if n is None:
                raise ValueError("sampling_params: a single request takes one dict, not a list")
            if len(raw) != n:
                raise ValueError(f"sampling_params: the list needs one dict per request ({n}), got {len(raw)}")
            dicts = raw
        elif isinstance(raw, Mapping):
            dicts = [raw] * count
        else:
            raise ValueError(f"sampling_params must be an object (or a list of objects for a batch), got {type(raw).__name__}")
        out = []
        for i, d in enumerate(dicts):
            where = "sampling_params" if not isinstance(raw, list) else f"sampling_params[{i}]"
            if not isinstance(d, Mapping):
                raise ValueError(f"{where} must be an object")
            try:
                out.append(SamplingParams.model_validate(dict(d)))
            except ValidationError as exc:
                raise ValueError(format_validation_error(exc, where)) from None
        return out

    def media_lists(self, field: str) -> list[list[MediaItem]]:
        """Per request, the items of one media field."""
        n = self.batch_size
        value = getattr(self, field)
        if n is None:
            return [_media_list(value, field)]
        if value is None:
            return [[] for _ in range(n)]
        if not isinstance(value, list) or len(value) != n:
            raise ValueError(f"{field}: a batch request needs a list with one entry (an item, a list of items or null) "
                             f"per request ({n}), got {_short(value)}")
        return [_media_list(v, f"{field}[{i}]") for i, v in enumerate(value)]

    def split(self) -> list[EngineRequest]:
        """The normalised single requests (one for a single request)."""
        n = self.batch_size
        count = n or 1
        sampling = self.sampling_list()
        media = {MEDIA_FIELDS[f]: self.media_lists(f) for f in MEDIA_FIELDS}
        if isinstance(self.rid, list):
            rids = list(self.rid)
        elif isinstance(self.rid, str):
            rids = [self.rid] if n is None else [f"{self.rid}_{i}" for i in range(n)]
        else:
            rids = [uuid.uuid4().hex for _ in range(count)]
        out = []
        for i in range(count):
            ids = self.input_ids if n is None else (self.input_ids[i] if self.input_ids is not None else None)
            text = self.text if n is None else (self.text[i] if self.text is not None else None)
            out.append(EngineRequest(
                rid=rids[i], input_ids=ids, text=text,
                media={kind: lists[i] for kind, lists in media.items() if lists[i]},
                sampling_params=sampling[i], return_logprob=bool(self._at("return_logprob", i)),
                top_logprobs_num=int(self._at("top_logprobs_num", i) or 0),
                return_text_in_logprobs=self.return_text_in_logprobs, index=i,
                return_routed_experts=bool(self._at("return_routed_experts", i)),
            ))
        return out


class FinishReason(BaseModel):
    """``{"type": "stop", "matched": id | str}``, ``{"type": "length", "length": n}`` or
    ``{"type": "abort", "message": ...}`` (SGLang's ``BaseFinishReason.to_json()``)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message, "status_code": None, "err_type": None}


class MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    weight_version: str | None = None
    e2e_latency: float | None = None
    output_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float | None, int, str | None]] | None] | None = None
    input_token_logprobs: list[Any] | None = None
    input_top_logprobs: list[Any] | None = None
    # SGLang's return_routed_experts: base64 of (prompt + completion - 1, layers, top_k) ids, and their dtype
    routed_experts: str | None = None
    routed_experts_dtype: str | None = None


class GenerateResponse(BaseModel):
    """One ``/generate`` result (a batch request answers a JSON list of these)."""

    model_config = ConfigDict(extra="allow")

    text: str
    output_ids: list[int]
    meta_info: MetaInfo

    def to_json(self) -> dict[str, Any]:
        out = self.model_dump(mode="json", exclude_none=False)
        meta = out["meta_info"]
        meta["finish_reason"] = self.meta_info.finish_reason.to_json() if self.meta_info.finish_reason else None
        for key in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs",
                    "routed_experts", "routed_experts_dtype"):
            if meta.get(key) is None:
                meta.pop(key, None)
        return out


# ------------------------------------------------------------------------------------------------ helpers


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


