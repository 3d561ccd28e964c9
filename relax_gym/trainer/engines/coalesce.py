"""Client-side request coalescing: many concurrent single ``/generate`` calls become one SGLang batch request.

An RL step launches hundreds of episodes at once; sent one HTTP request each, they reach the engine spread over
tens of milliseconds (every request pays the client's connection handling and the server's parsing), and an
engine that batches by arrival time runs them as several small batches. :class:`CoalescingClient` gathers the
calls made within a short quiet window (``window_s``, at most ``max_wait_s`` after the first) and sends them as
one batch request of SGLang's protocol (lists of ``input_ids``, per-request media and sampling params), so they
arrive together and are scheduled together. It works against any server that speaks the protocol.

Failure isolation: if the server refuses the batch (HTTP 4xx, e.g. one request's media does not match its
prompt), every request of it is re-sent alone, so only the culprit sees the error. Other failures (connection,
5xx) reach every caller of the batch, as they would have reached each single call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relax_gym.trainer.engines.client import AsyncEngineClient, EngineHTTPError, GenerateOutput

__all__ = ["CoalescingClient"]


@dataclass
class _Call:
    input_ids: list[int]
    media: dict[str, Any]
    sampling_params: dict[str, Any]
    future: asyncio.Future = field(repr=False)


class CoalescingClient:
    """Wraps an :class:`AsyncEngineClient`; ``generate`` has the same signature for token-id prompts.

    Calls with the same ``return_logprob`` / ``top_logprobs_num`` / ``return_routed_experts`` share a batch; ``max_batch`` caps one HTTP
    request (the engine still splits by its own ``max_batch``). Everything else is delegated to the client."""

    def __init__(self, client: AsyncEngineClient, *, window_s: float = 0.002, max_wait_s: float = 0.02,
                 max_batch: int = 256) -> None:
        if window_s <= 0 or max_wait_s < window_s or max_batch < 1:
            raise ValueError("need 0 < window_s <= max_wait_s and max_batch >= 1")
        self.client = client
        self.window_s = float(window_s)
        self.max_wait_s = float(max_wait_s)
        self.max_batch = int(max_batch)
        self._pending: dict[tuple[bool, int | None, bool], list[_Call]] = {}
        self._flushers: dict[tuple[bool, int | None, bool], asyncio.Task] = {}
        self._arrived: dict[tuple[bool, int | None, bool], asyncio.Event] = {}
        self.stats = {"calls": 0, "batches": 0, "fallback_batches": 0}

    def __getattr__(self, name: str) -> Any:  # weights, control, health: straight to the wrapped client
        if name == "client":  # not set yet (or a subclass without one)
            raise AttributeError(name)
        return getattr(self.client, name)

    async def generate(self, input_ids: Sequence[int], *, image_data: Any = None, video_data: Any = None,
                       audio_data: Any = None, sampling_params: Mapping[str, Any] | None = None,
                       return_logprob: bool = True, top_logprobs_num: int | None = None,
                       return_routed_experts: bool = False,
                       on_token: Callable[[int], None] | None = None) -> GenerateOutput:
        """One request, batched with its neighbours; ``on_token`` (a streamed request: each token id as it comes)
        sends it alone, streamed."""
        if on_token is not None:
            media = {k: v for k, v in (("image_data", image_data), ("video_data", video_data), ("audio_data", audio_data)) if v}
            self.stats["calls"] += 1
            return await self._generate_one([int(i) for i in input_ids], **media, sampling_params=dict(sampling_params or {}),
                                            return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
                                            **({"return_routed_experts": True} if return_routed_experts else {}),
                                            on_token=on_token)
        key = (bool(return_logprob), top_logprobs_num, bool(return_routed_experts))
        call = _Call([int(i) for i in input_ids], {"image_data": image_data, "video_data": video_data, "audio_data": audio_data},
                     dict(sampling_params or {}), asyncio.get_running_loop().create_future())
        self.stats["calls"] += 1
        queue = self._pending.setdefault(key, [])
        queue.append(call)
        if len(queue) >= self.max_batch:
            self._send_now(key)
        elif key not in self._flushers:
            self._arrived[key] = asyncio.Event()
            self._flushers[key] = asyncio.create_task(self._flush_when_quiet(key))
        else:
            self._arrived[key].set()
        return await call.future

    async def _flush_when_quiet(self, key: tuple[bool, int | None, bool]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        arrived = self._arrived[key]
        while True:
            arrived.clear()
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(arrived.wait(), timeout=min(self.window_s, left))
            except TimeoutError:
                break  # a quiet window: nobody else is about to call
        self._flushers.pop(key, None)
        self._send_now(key)

    def _send_now(self, key: tuple[bool, int | None, bool]) -> None:
        calls = self._pending.pop(key, [])
        task = self._flushers.pop(key, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        if calls:
            asyncio.ensure_future(self._send(calls, key))

    async def _send(self, calls: list[_Call], key: tuple[bool, int | None, bool]) -> None:
        return_logprob, top_n, routed = key
        if len(calls) == 1:
            await self._send_one(calls[0], key)
            return
        self.stats["batches"] += 1
        media = {kind: [c.media[kind] or None for c in calls] for kind in ("image_data", "video_data", "audio_data")}
        media = {kind: items for kind, items in media.items() if any(items)}
        try:
            outs = await self._generate_batch([c.input_ids for c in calls], **media,
                                              sampling_params=[c.sampling_params for c in calls],
                                              return_logprob=return_logprob, top_logprobs_num=top_n,
                                              **({"return_routed_experts": True} if routed else {}))
        except EngineHTTPError as exc:
            if 400 <= exc.status_code < 500:  # one bad request must not fail its neighbours: resend them alone
                self.stats["fallback_batches"] += 1
                await asyncio.gather(*(self._send_one(c, key) for c in calls))
                return
            self._fail(calls, exc)
            return
        except Exception as exc:  # noqa: BLE001 - delivered to every caller of the batch
            self._fail(calls, exc)
            return
        if len(outs) != len(calls):
            self._fail(calls, RuntimeError(f"/generate answered {len(outs)} results for a batch of {len(calls)}"))
            return
        for call, out in zip(calls, outs):
            if not call.future.done():
                call.future.set_result(out)

    async def _send_one(self, call: _Call, key: tuple[bool, int | None, bool]) -> None:
        return_logprob, top_n, routed = key
        try:
            out = await self._generate_one(call.input_ids, **{k: v for k, v in call.media.items() if v},
                                           sampling_params=call.sampling_params, return_logprob=return_logprob,
                                           top_logprobs_num=top_n, **({"return_routed_experts": True} if routed else {}))
        except Exception as exc:  # noqa: BLE001 - the caller gets exactly what a single call would raise
            self._fail([call], exc)
            return
        if not call.future.done():
            call.future.set_result(out)

    # the two calls that reach the engine (a subclass may reach it another way, see serve_client.py)

    async def _generate_batch(self, input_ids: list[list[int]], **kwargs: Any) -> list[GenerateOutput]:
        return await self.client.generate_batch(input_ids, **kwargs)

    async def _generate_one(self, input_ids: list[int], **kwargs: Any) -> GenerateOutput:
        return await self.client.generate(input_ids, **kwargs)

    @staticmethod
    def _fail(calls: list[_Call], exc: BaseException) -> None:
        for call in calls:
            if not call.future.done():
                call.future.set_exception(exc)
