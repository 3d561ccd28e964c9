"""The engine side of a push, seen from the actor: SGLang's weight and control endpoints over HTTP.

:class:`EngineAPI` is a small blocking HTTP client of the endpoints a push uses (``/pause_generation``,
``/update_weights_from_distributed``, ``/update_weights_from_disk``, ``/flush_cache``, ...), so the DCS drives a
real SGLang server and the embedded engine alike without depending on the engines package. :class:`EngineLink`
runs one engine's steps and raises :class:`~relax_gym.trainer.dcs.errors.DCSEngineError` naming the engine and
the step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from relax_gym.trainer.dcs.coordinator import EngineInfo, TensorMeta
from relax_gym.trainer.dcs.errors import DCSEngineError

__all__ = ["EngineAPI", "EngineAPIError", "EngineLink"]


class EngineAPIError(RuntimeError):
    """An engine call failed: ``status`` is the HTTP status (None when the engine could not be reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class EngineAPI:
    """Blocking client of an engine's weight / control endpoints (``url``: ``http://host:port``). Requests that
    never reached the engine are resent ``retries`` times."""

    def __init__(self, url: str, *, timeout_s: float = 300.0, retries: int = 1, backoff_s: float = 0.1) -> None:
        self.url = url.rstrip("/")
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        # engines on a non-loopback host need it; dcs may not import engines (engines/client.py: engine_token)
        token = os.environ.get("RELAX_GYM_ENGINE_TOKEN")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"} if token else None)

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never reached the engine: safe to resend
                last = exc
                if attempt < self.retries:
                    time.sleep(min(self.backoff_s * 2**attempt, 5.0))
                continue
            except httpx.HTTPError as exc:
                raise EngineAPIError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
            try:
                body = response.json()
            except ValueError:
                body = response.text
            if response.status_code >= 400:
                message = body
                if isinstance(body, Mapping):
                    inner = body.get("error") if isinstance(body.get("error"), Mapping) else body
                    message = inner.get("message", body)
                raise EngineAPIError(f"HTTP {response.status_code} from {path}: {message}", response.status_code)
            return body
        raise EngineAPIError(f"{method} {self.url}{path}: {last} (after {self.retries + 1} attempts)") from last

    def health(self) -> bool:
        try:
            self._call("GET", "/health")
            return True
        except EngineAPIError:
            return False

    def pause_generation(self, mode: str = "retract") -> Any:
        return self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> Any:
        return self._call("POST", "/continue_generation", {})

    def flush_cache(self) -> Any:
        return self._call("POST", "/flush_cache")

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
                                  group_name: str, backend: str) -> Any:
        return self._call("POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    def destroy_weights_update_group(self, group_name: str) -> Any:
        return self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *,
                                        group_name: str, weight_version: str | None = None, flush_cache: bool = True,
                                        load_format: str | None = None, stage_id: str | None = None,
                                        seq: int | None = None) -> Any:
        """SGLang's call; with ``stage_id`` / ``seq`` (ours) the engine stages the tensors instead of loading them."""
        return self._call("POST", "/update_weights_from_distributed", _drop_none({
            "names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": [[int(s) for s in shape] for shape in shapes], "group_name": group_name,
            "weight_version": weight_version, "flush_cache": flush_cache, "abort_all_requests": False,
            "load_format": load_format, "stage_id": stage_id, "seq": seq}))

    def apply_staged_weights(self, stage_id: str, calls: int, *, weight_version: str | None = None) -> Any:
        return self._call("POST", "/apply_staged_weights", _drop_none({
            "stage_id": stage_id, "calls": int(calls), "weight_version": weight_version}))

    def discard_staged_weights(self, stage_id: str | None = None) -> Any:
        return self._call("POST", "/discard_staged_weights", _drop_none({"stage_id": stage_id}))

    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                 flush_cache: bool = True) -> Any:
        return self._call("POST", "/update_weights_from_disk", _drop_none({
            "model_path": str(model_path), "weight_version": weight_version, "abort_all_requests": False,
            "flush_cache": flush_cache}))

    def get_weight_version(self) -> str | None:
        """``/get_weight_version``, or ``/model_info``'s ``weight_version`` where that endpoint is gone."""
        try:
            data = self._call("GET", "/get_weight_version")
        except EngineAPIError as exc:
            if exc.status != 404:
                raise
            data = self._call("GET", "/model_info")
        return data.get("weight_version") if isinstance(data, Mapping) else None

    def get_server_info(self) -> Any:
        """``/get_server_info`` (``/server_info`` on SGLang versions that dropped the old name)."""
        try:
            return self._call("GET", "/get_server_info")
        except EngineAPIError as exc:
            if exc.status != 404:
                raise
            return self._call("GET", "/server_info")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineAPI:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EngineLink:
    """The engine-side steps of a push for one engine, over its HTTP protocol. Each method raises
    :class:`DCSEngineError` naming the engine and the step."""

    def __init__(self, info: EngineInfo, *, timeout_s: float = 300.0, retries: int = 1) -> None:
        self.info = info
        self.client = EngineAPI(info.url, timeout_s=timeout_s, retries=retries, backoff_s=0.1)

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def rank(self) -> int:
        return self.info.rank

    def _call(self, step: str, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except EngineAPIError as exc:
            raise DCSEngineError(self.url, step, exc) from exc
        if isinstance(result, Mapping) and result.get("success") is False:
            raise DCSEngineError(self.url, step, result.get("message", "the engine answered success=false"))
        return result

    def pause(self, mode: str = "retract") -> None:
        self._call("pause_generation", lambda: self.client.pause_generation(mode))

    def resume(self) -> None:
        self._call("continue_generation", self.client.continue_generation)

    def flush(self, timeout_s: float = 30.0) -> None:
        """``/flush_cache``; SGLang refuses while requests are still being retracted, so it is retried."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.flush_cache()
                return
            except EngineAPIError as exc:
                if time.monotonic() >= deadline:
                    raise DCSEngineError(self.url, "flush_cache", exc) from exc
                time.sleep(0.1)

    def join_group(self, master_address: str, master_port: int, world_size: int, group_name: str, backend: str) -> None:
        self._call("init_weights_update_group", lambda: self.client.init_weights_update_group(
            master_address, master_port, self.rank, world_size, group_name=group_name, backend=backend))

    def leave_group(self, group_name: str) -> None:
        """Best effort: an engine that is gone has left already."""
        try:
            self.client.destroy_weights_update_group(group_name)
        except EngineAPIError:
            pass

    def receive_distributed(self, metas: Sequence[TensorMeta], group_name: str, load_format: str | None,
                            weight_version: str | None) -> None:
        self._call("update_weights_from_distributed", lambda: self.client.update_weights_from_distributed(
            [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas], group_name=group_name,
            weight_version=weight_version, flush_cache=False, load_format=load_format))

    def stage_distributed(self, metas: Sequence[TensorMeta], group_name: str, load_format: str | None, stage_id: str,
                          seq: int) -> None:
        """Call ``seq`` of staged push ``stage_id``: the engine receives it into its staging area and keeps
        generating on its current weights."""
        self._call("update_weights_from_distributed", lambda: self.client.update_weights_from_distributed(
            [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas], group_name=group_name,
            flush_cache=False, load_format=load_format, stage_id=stage_id, seq=seq))

    def apply_staged(self, stage_id: str, calls: int, weight_version: str) -> None:
        """Swap the ``calls`` staged calls of ``stage_id`` into the model as ``weight_version`` (engine paused)."""
        self._call("apply_staged_weights", lambda: self.client.apply_staged_weights(
            stage_id, calls, weight_version=weight_version))

    def discard_staged(self, stage_id: str) -> None:
        """Best effort: the engine drops an unfinished stage anyway when the next one begins."""
        try:
            self.client.discard_staged_weights(stage_id)
        except EngineAPIError:
            pass

    def load_from_disk(self, path: str, weight_version: str) -> None:
        self._call("update_weights_from_disk", lambda: self.client.update_weights_from_disk(
            path, weight_version=weight_version, flush_cache=False))

    def weight_version(self) -> str | None:
        return self._call("get_weight_version", self.client.get_weight_version)

    def supports_flattened(self) -> bool:
        """Whether the engine advertises SGLang's ``flattened_bucket`` load format (our embedded engine does)."""
        return self.features()[0]

    def features(self) -> tuple[bool, bool]:
        """What the engine advertises in ``/get_server_info``: (SGLang's ``flattened_bucket`` load format, our
        ``weight_update_staging``). The embedded engine has both; SGLang neither of ours."""
        info = self._call("get_server_info", self.client.get_server_info)
        if not isinstance(info, Mapping):
            return False, False
        return "flattened_bucket" in (info.get("weight_update_load_formats") or []), info.get("weight_update_staging") is True

    def close(self) -> None:
        self.client.close()


