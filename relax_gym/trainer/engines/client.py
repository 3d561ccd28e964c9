"""A client for SGLang's native HTTP protocol (httpx): :class:`AsyncEngineClient` and its thread-safe sync
wrapper :class:`EngineClient`. It speaks only HTTP (it never imports the embedded engine), so it drives
:func:`~relax_gym.trainer.engines.http_server.serve` and a real SGLang server alike -- except
``update_weights_from_tensor``, whose payload is our safetensors wire format (see
:mod:`~relax_gym.trainer.engines.protocol`; a real SGLang server needs the disk or distributed path).

    client = EngineClient(server.url)
    client.wait_healthy(30)
    out = client.generate(rendered.input_ids, **media_data(obs), sampling_params={"max_new_tokens": 64})
    out.output_ids, out.output_logprobs, out.finish_reason["type"], out.weight_version

Connection failures (nothing reached the server) are retried with exponential backoff, ``retries`` times; a 4xx /
5xx answer raises :class:`EngineHTTPError` carrying the status and the server's message (``{"message": ...}`` of
the JSON error body, or the text body).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import torch

from relax_gym.trainer.engines.admin_protocol import DEFAULT_GROUP_NAME, serialize_named_tensors

__all__ = ["AsyncEngineClient", "EngineClient", "EngineConnectionError", "EngineError", "EngineHTTPError", "GenerateOutput",
           "generate_batch_body", "generate_body"]

T = TypeVar("T")


class EngineError(RuntimeError):
    """Base of the client's errors."""


class EngineHTTPError(EngineError):
    """The server answered 4xx / 5xx; ``message`` is the server's explanation."""

    def __init__(self, status_code: int, message: str, path: str, body: Any = None) -> None:
        super().__init__(f"{path} -> HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.path = path
        self.body = body


class EngineConnectionError(EngineError):
    """The server could not be reached (after the retries)."""


@dataclass
class GenerateOutput:
    """One generate result. ``output_logprobs``: the sampled tokens' log-probs (None unless requested);
    ``finish_reason``: SGLang's dict (``{"type": "stop" | "length" | "abort", ...}``)."""

    output_ids: list[int]
    output_logprobs: list[float] | None
    text: str
    finish_reason: dict[str, Any] | None
    weight_version: str | None
    prompt_tokens: int
    completion_tokens: int = 0
    rid: str | None = None
    meta_info: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerateOutput:
        meta = dict(data.get("meta_info") or {})
        pairs = meta.get("output_token_logprobs")
        ids = list(data.get("output_ids") or [])
        if not ids and pairs:
            ids = [int(p[1]) for p in pairs]
        return cls(
            output_ids=[int(i) for i in ids],
            output_logprobs=[float(p[0]) if p[0] is not None else float("nan") for p in pairs] if pairs is not None else None,
            text=str(data.get("text", "")),
            finish_reason=meta.get("finish_reason"),
            weight_version=meta.get("weight_version"),
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", len(ids))),
            rid=meta.get("id"),
            meta_info=meta,
        )

    @property
    def finish_type(self) -> str | None:
        return (self.finish_reason or {}).get("type")


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def generate_body(input_ids: Sequence[int] | None = None, *, text: str | None = None, image_data: Any = None,
                  video_data: Any = None, audio_data: Any = None, sampling_params: Mapping[str, Any] | None = None,
                  return_logprob: bool = True, top_logprobs_num: int | None = None, rid: str | None = None,
                  **extra: Any) -> dict[str, Any]:
    """The ``/generate`` body (SGLang's ``GenerateReqInput`` as a dict) of one request."""
    if (input_ids is None) == (text is None):
        raise ValueError("give exactly one of input_ids / text")
    return _drop_none({
        "input_ids": [int(i) for i in input_ids] if input_ids is not None else None, "text": text,
        "image_data": image_data or None, "video_data": video_data or None, "audio_data": audio_data or None,
        "sampling_params": dict(sampling_params or {}), "return_logprob": return_logprob,
        "top_logprobs_num": top_logprobs_num, "rid": rid, **extra,
    })


def generate_batch_body(input_ids: Sequence[Sequence[int]] | None = None, *, text: Sequence[str] | None = None,
                        image_data: Sequence[Any] | None = None, video_data: Sequence[Any] | None = None,
                        audio_data: Sequence[Any] | None = None,
                        sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
                        return_logprob: bool = True, top_logprobs_num: int | None = None,
                        rid: str | Sequence[str] | None = None, **extra: Any) -> dict[str, Any]:
    """The ``/generate`` body of a batch request (per-request lists)."""
    if (input_ids is None) == (text is None):
        raise ValueError("give exactly one of input_ids / text")
    sp: Any = dict(sampling_params or {}) if sampling_params is None or isinstance(sampling_params, Mapping) else [dict(s) for s in sampling_params]
    return _drop_none({
        "input_ids": [[int(i) for i in row] for row in input_ids] if input_ids is not None else None,
        "text": list(text) if text is not None else None,
        "image_data": list(image_data) if image_data is not None else None,
        "video_data": list(video_data) if video_data is not None else None,
        "audio_data": list(audio_data) if audio_data is not None else None,
        "sampling_params": sp, "return_logprob": return_logprob, "top_logprobs_num": top_logprobs_num,
        "rid": list(rid) if isinstance(rid, Sequence) and not isinstance(rid, str) else rid, **extra,
    })


def _error_message(response: httpx.Response) -> tuple[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return (response.text.strip() or response.reason_phrase), response.text
    if isinstance(body, Mapping):
        if isinstance(body.get("error"), Mapping):
            return str(body["error"].get("message", body)), body
        if "message" in body:
            return str(body["message"]), body
    return str(body), body


ENGINE_TOKEN_ENV = "RELAX_GYM_ENGINE_TOKEN"


def engine_token() -> str | None:
    """The engine servers' shared token from ``$RELAX_GYM_ENGINE_TOKEN`` (None when unset): a trainer whose engines
    bind a non-loopback ``inference.host`` sets it on every node; the servers require it, the clients send it."""
    import os

    return os.environ.get(ENGINE_TOKEN_ENV) or None


def with_engine_token(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer <engine_token()>`` when a token is set and no Authorization header
    is given."""
    out = dict(headers or {})
    token = engine_token()
    if token and not any(k.lower() == "authorization" for k in out):
        out["Authorization"] = f"Bearer {token}"
    return out


class AsyncEngineClient:
    """Async client of one engine server (``base_url``: ``http://host:port``)."""

    def __init__(self, base_url: str, *, timeout: float = 300.0, retries: int = 3, backoff_s: float = 0.2,
                 transport: httpx.AsyncBaseTransport | None = None, headers: Mapping[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport,
                                       headers=with_engine_token(headers), limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncEngineClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------------ transport

    async def _request(self, method: str, path: str, payload: Any = None, *, idempotent: bool = True,
                       timeout: float | None = None) -> httpx.Response:
        last: Exception | None = None
        kwargs: dict[str, Any] = {}
        if payload is not None:
            kwargs["json"] = payload
        if timeout is not None:
            kwargs["timeout"] = timeout
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(method, path, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never reached the server: safe to resend
                last = exc
            except httpx.RemoteProtocolError as exc:  # dropped connection: resend only what is idempotent
                if not idempotent:
                    raise EngineConnectionError(f"{method} {self.base_url}{path}: {exc}") from exc
                last = exc
            else:
                if response.status_code >= 400:
                    message, body = _error_message(response)
                    raise EngineHTTPError(response.status_code, message, path, body)
                return response
            if attempt < self.retries:
                await asyncio.sleep(min(self.backoff_s * 2**attempt, 5.0))
        raise EngineConnectionError(f"{method} {self.base_url}{path}: {last} (after {self.retries + 1} attempts)") from last

    async def _json(self, method: str, path: str, payload: Any = None, **kwargs: Any) -> Any:
        response = await self._request(method, path, payload, **kwargs)
        try:
            return response.json()
        except ValueError:
            return response.text

    # ------------------------------------------------------------------------------------------ generate

    async def generate(self, input_ids: Sequence[int] | None = None, *, text: str | None = None,
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       sampling_params: Mapping[str, Any] | None = None, return_logprob: bool = True,
                       top_logprobs_num: int | None = None, rid: str | None = None,
                       on_token: Callable[[int], None] | None = None, **extra: Any) -> GenerateOutput:
        """One request: ``input_ids`` (media pad tokens expanded, as ``render`` writes them) or ``text``; media
        items as in :mod:`~relax_gym.trainer.engines.protocol` (``**media_data(messages)`` builds them).
        ``on_token``: the request is streamed (``stream: true``, SGLang's events) and each new token id is handed
        to it as it arrives (on this loop); the answer is the same as without it."""
        if extra.pop("stream", False):
            raise ValueError("stream=True: pass on_token= (a callable that takes each token id) to stream a request")
        payload = generate_body(input_ids, text=text, image_data=image_data, video_data=video_data,
                                audio_data=audio_data, sampling_params=sampling_params, return_logprob=return_logprob,
                                top_logprobs_num=top_logprobs_num, rid=rid, **extra)
        if on_token is not None:
            return GenerateOutput.from_json(await self._generate_streamed({**payload, "stream": True}, on_token))
        data = await self._json("POST", "/generate", payload)
        if isinstance(data, list):
            raise EngineError(f"/generate answered a list of {len(data)} for a single request")
        return GenerateOutput.from_json(data)

    async def _generate_streamed(self, payload: Mapping[str, Any], on_token: Callable[[int], None]) -> dict[str, Any]:
        """POST a streamed ``/generate``; hand each new id of the events' ``output_ids`` (cumulative, or only the
        new ones as SGLang's incremental streaming sends them) to ``on_token``; the last event before ``[DONE]`` (the
        whole response; with incremental events its ``output_ids`` are made whole here). Not resent once it reached
        the server."""
        seen, last, all_ids, all_logprobs, chopped = 0, None, [], [], False
        try:
            async with self._http.stream("POST", "/generate", json=dict(payload)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    message, body = _error_message(response)
                    raise EngineHTTPError(response.status_code, message, "/generate", body)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if isinstance(event, Mapping) and "error" in event:
                        error = event["error"]
                        raise EngineError(f"/generate failed while streaming: "
                                          f"{error.get('message') if isinstance(error, Mapping) else error}")
                    ids = list(event.get("output_ids") or [])
                    total = (event.get("meta_info") or {}).get("completion_tokens")
                    # cumulative ids (ours; SGLang by default) or only the new ones (SGLang's incremental streaming
                    # output): the event's completion_tokens tells which
                    incremental = total is not None and len(ids) < total and len(ids) == total - seen
                    fresh = ids if incremental else ids[seen:]
                    for token in fresh:
                        on_token(int(token))
                    all_ids += [int(t) for t in fresh]
                    pieces = list((event.get("meta_info") or {}).get("output_token_logprobs") or [])
                    if incremental:  # the log-probs come per event too: kept whole for the record
                        all_logprobs += pieces
                        chopped = True
                    else:
                        all_logprobs = pieces
                    seen, last = seen + len(fresh), event
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise EngineConnectionError(f"POST {self.base_url}/generate (streamed): {exc}") from exc
        if last is None:
            raise EngineError("/generate streamed no event before [DONE]")
        if not chopped:
            return dict(last)
        meta = dict(last.get("meta_info") or {})
        if all_logprobs:
            meta["output_token_logprobs"] = all_logprobs
        return {**last, "output_ids": all_ids, "meta_info": meta}

    async def generate_batch(self, input_ids: Sequence[Sequence[int]] | None = None, *, text: Sequence[str] | None = None,
                             image_data: Sequence[Any] | None = None, video_data: Sequence[Any] | None = None,
                             audio_data: Sequence[Any] | None = None,
                             sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
                             return_logprob: bool = True, top_logprobs_num: int | None = None,
                             rid: str | Sequence[str] | None = None, **extra: Any) -> list[GenerateOutput]:
        """A batch request (one HTTP call): per-request media lists (an item list or None per request),
        ``sampling_params`` one dict for all or a list of dicts."""
        payload = generate_batch_body(input_ids, text=text, image_data=image_data, video_data=video_data,
                                      audio_data=audio_data, sampling_params=sampling_params,
                                      return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, rid=rid, **extra)
        data = await self._json("POST", "/generate", payload)
        if not isinstance(data, list):
            raise EngineError("/generate answered a single result for a batch request")
        return [GenerateOutput.from_json(d) for d in data]

    # ------------------------------------------------------------------------------------------ weights

    async def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                       load_format: str | None = None, abort_all_requests: bool = False,
                                       flush_cache: bool = True) -> dict[str, Any]:
        return await self._json("POST", "/update_weights_from_disk", _drop_none({
            "model_path": str(model_path), "weight_version": weight_version, "load_format": load_format,
            "abort_all_requests": abort_all_requests, "flush_cache": flush_cache}), idempotent=True)

    async def update_weights_from_tensor(self, named_tensors: Mapping[str, torch.Tensor], weight_version: str | None = None, *,
                                         abort_all_requests: bool = False, flush_cache: bool = True) -> dict[str, Any]:
        """Send tensors in our wire format (base64 safetensors, one payload: the embedded engine has one rank)."""
        payload = serialize_named_tensors(named_tensors)
        return await self._json("POST", "/update_weights_from_tensor", _drop_none({
            "serialized_named_tensors": [payload], "load_format": None, "weight_version": weight_version,
            "abort_all_requests": abort_all_requests, "flush_cache": flush_cache}), idempotent=True)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
                                        group_name: str = DEFAULT_GROUP_NAME, backend: str = "gloo") -> dict[str, Any]:
        return await self._json("POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend}, idempotent=False)

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *,
                                              group_name: str = DEFAULT_GROUP_NAME, weight_version: str | None = None,
                                              flush_cache: bool = True, abort_all_requests: bool = False,
                                              load_format: str | None = None) -> dict[str, Any]:
        """Announce a broadcast; the trainer must broadcast the tensors meanwhile
        (the DCS's ``push_weights_distributed`` does both). ``load_format``:
        None for one broadcast per tensor, ``"flattened_bucket"`` for one broadcast of all their bytes."""
        return await self._json("POST", "/update_weights_from_distributed", _drop_none({
            "names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": [[int(s) for s in shape] for shape in shapes], "group_name": group_name,
            "weight_version": weight_version, "flush_cache": flush_cache, "abort_all_requests": abort_all_requests,
            "load_format": load_format}),
            idempotent=False)

    async def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP_NAME) -> dict[str, Any]:
        return await self._json("POST", "/destroy_weights_update_group", {"group_name": group_name}, idempotent=False)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> dict[str, Any]:
        return await self._json("POST", "/update_weight_version",
                                {"new_version": str(new_version), "abort_all_requests": abort_all_requests})

    # ------------------------------------------------------------------------------------------ control

    async def pause_generation(self, mode: str = "abort") -> dict[str, Any]:
        return await self._json("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> dict[str, Any]:
        return await self._json("POST", "/continue_generation", {})

    async def flush_cache(self) -> bool:
        await self._request("POST", "/flush_cache")
        return True

    async def health(self) -> bool:
        try:
            await self._request("GET", "/health")
            return True
        except EngineError:
            return False

    async def health_generate(self, timeout: float | None = None) -> bool:
        """True when the server answers ``/health_generate`` with 200 (a 1-token generate ran)."""
        try:
            await self._request("GET", "/health_generate", timeout=timeout)
            return True
        except (EngineError, httpx.TimeoutException):
            return False

    async def wait_healthy(self, timeout: float = 60.0, *, interval: float = 0.1) -> None:
        """Poll ``/health_generate`` until it answers 200; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.base_url} was not healthy within {timeout} s")
            try:
                response = await self._http.get("/health_generate", timeout=max(0.1, left))
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    async def get_model_info(self) -> dict[str, Any]:
        return await self._json("GET", "/get_model_info")

    async def get_server_info(self) -> dict[str, Any]:
        """``/get_server_info`` (``/server_info`` on SGLang versions that dropped the old name)."""
        try:
            return await self._json("GET", "/get_server_info")
        except EngineHTTPError as exc:
            if exc.status_code != 404:
                raise
            return await self._json("GET", "/server_info")

    async def get_weight_version(self) -> str | None:
        """The version the engine reports: ``/get_weight_version``, or the ``weight_version`` of ``/model_info``
        where that endpoint is gone (SGLang 0.5.23 has only ``/model_info`` / ``/get_model_info``)."""
        try:
            data = await self._json("GET", "/get_weight_version")
        except EngineHTTPError as exc:
            if exc.status_code != 404:
                raise
            data = await self._json("GET", "/model_info")
        return data.get("weight_version") if isinstance(data, Mapping) else None

    async def weights_checksum(self, names: Sequence[str] | None = None) -> dict[str, str]:
        """SHA-256 digests of the engine's weights by name (our ``/get_weights_checksum``; embedded engine only)."""
        data = await self._json("POST", "/get_weights_checksum", {"names": list(names) if names is not None else None})
        return dict(data["checksums"])

    # ------------------------------------------------------------------------------------------ recorded sessions

    async def get_session(self, session_id: str) -> dict[str, Any]:
        """The calls an agent made through ``/v1/chat/completions`` under ``session_id`` (embedded engine)."""
        return await self._json("GET", f"/v1/relax/sessions/{quote(session_id, safe='')}")

    async def delete_session(self, session_id: str) -> dict[str, Any]:
        """Drop a consumed session from the engine's recorder."""
        return await self._json("DELETE", f"/v1/relax/sessions/{quote(session_id, safe='')}")

    async def list_sessions(self) -> dict[str, int]:
        """Recorded session ids → call counts."""
        data = await self._json("GET", "/v1/relax/sessions")
        return {d["id"]: int(d["calls"]) for d in data.get("data", [])}


class EngineClient:
    """Thread-safe synchronous wrapper of :class:`AsyncEngineClient`: each call runs on a private event-loop
    thread, so calls from many threads proceed concurrently (the server batches them)."""

    def __init__(self, base_url: str, *, timeout: float = 300.0, retries: int = 3, backoff_s: float = 0.2,
                 headers: Mapping[str, str] | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-client-loop", daemon=True)
        self._thread.start()
        self.base_url = base_url.rstrip("/")

        async def make() -> AsyncEngineClient:
            return AsyncEngineClient(base_url, timeout=timeout, retries=retries, backoff_s=backoff_s, headers=headers)

        self.aclient = self._run(make())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise EngineError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.aclient.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def generate(self, input_ids: Sequence[int] | None = None, **kwargs: Any) -> GenerateOutput:
        return self._run(self.aclient.generate(input_ids, **kwargs))

    def generate_batch(self, input_ids: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> list[GenerateOutput]:
        return self._run(self.aclient.generate_batch(input_ids, **kwargs))

    def update_weights_from_disk(self, model_path: str, **kwargs: Any) -> dict[str, Any]:
        return self._run(self.aclient.update_weights_from_disk(model_path, **kwargs))

    def update_weights_from_tensor(self, named_tensors: Mapping[str, torch.Tensor], weight_version: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._run(self.aclient.update_weights_from_tensor(named_tensors, weight_version, **kwargs))

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int, **kwargs: Any) -> dict[str, Any]:
        return self._run(self.aclient.init_weights_update_group(master_address, master_port, rank_offset, world_size, **kwargs))

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], **kwargs: Any) -> dict[str, Any]:
        return self._run(self.aclient.update_weights_from_distributed(names, dtypes, shapes, **kwargs))

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP_NAME) -> dict[str, Any]:
        return self._run(self.aclient.destroy_weights_update_group(group_name))

    def update_weight_version(self, new_version: str, **kwargs: Any) -> dict[str, Any]:
        return self._run(self.aclient.update_weight_version(new_version, **kwargs))

    def pause_generation(self, mode: str = "abort") -> dict[str, Any]:
        return self._run(self.aclient.pause_generation(mode))

    def continue_generation(self) -> dict[str, Any]:
        return self._run(self.aclient.continue_generation())

    def flush_cache(self) -> bool:
        return self._run(self.aclient.flush_cache())

    def health(self) -> bool:
        return self._run(self.aclient.health())

    def health_generate(self, timeout: float | None = None) -> bool:
        return self._run(self.aclient.health_generate(timeout))

    def wait_healthy(self, timeout: float = 60.0, *, interval: float = 0.1) -> None:
        return self._run(self.aclient.wait_healthy(timeout, interval=interval))

    def get_model_info(self) -> dict[str, Any]:
        return self._run(self.aclient.get_model_info())

    def get_server_info(self) -> dict[str, Any]:
        return self._run(self.aclient.get_server_info())

    def get_weight_version(self) -> str | None:
        return self._run(self.aclient.get_weight_version())

    def weights_checksum(self, names: Sequence[str] | None = None) -> dict[str, str]:
        return self._run(self.aclient.weights_checksum(names))

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self._run(self.aclient.get_session(session_id))

    def delete_session(self, session_id: str) -> dict[str, Any]:
        return self._run(self.aclient.delete_session(session_id))

    def list_sessions(self) -> dict[str, int]:
        return self._run(self.aclient.list_sessions())
