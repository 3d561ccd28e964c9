"""The coalescing client against the embedded engine over real loopback HTTP: concurrent calls travel as one batch
request with the same results as single calls; a bad request fails alone; a dead server fails every caller."""

from __future__ import annotations

import asyncio

import pytest

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.engines.client import AsyncEngineClient, EngineConnectionError, EngineHTTPError
from relax_gym.trainer.engines.coalesce import CoalescingClient
from relax_gym.trainer.engines.media_items import media_data

GREEDY = {"temperature": 0.0}


def _requests(processor, n: int) -> list[tuple[list[int], dict]]:
    """Mixed prompts: nextqa videos, echo-ink image + audio, plain text (no media)."""
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append((processor.encode_text(f"plain text prompt number {i}"), {}))
            continue
        obs, _ = relax_gym.make("nextqa-video" if i % 3 == 0 else "echo-ink").reset(seed=i)
        out.append((render(obs, processor).input_ids, media_data(obs)))
    return out


def test_concurrent_calls_travel_as_one_batch_with_single_call_results(served):
    reqs = _requests(served.processor, 9)
    params = [{"max_new_tokens": 3 + i % 4, "ignore_eos": True, **GREEDY} for i in range(len(reqs))]

    async def main():
        async with AsyncEngineClient(served.server.url) as raw:
            client = CoalescingClient(raw)
            before = served.engine.stats()["batches"]
            together = await asyncio.gather(*(client.generate(ids, **media, sampling_params=p) for (ids, media), p in zip(reqs, params)))
            batches = served.engine.stats()["batches"] - before
            alone = [await raw.generate(ids, **media, sampling_params=p) for (ids, media), p in zip(reqs, params)]
            return client.stats, batches, together, alone

    stats, batches, together, alone = asyncio.run(main())
    assert stats == {"calls": 9, "batches": 1, "fallback_batches": 0}
    assert batches == 1  # all nine scheduled in one engine batch
    for i, (a, b) in enumerate(zip(together, alone)):
        assert a.output_ids == b.output_ids and len(a.output_ids) == params[i]["max_new_tokens"], i
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-4)


def test_a_refused_request_fails_alone(served):
    (ids, media), (ids2, media2) = _requests(served.processor, 2)
    bad_media = {"video_data": media["video_data"] * 2}  # two videos for a prompt with one: the server refuses it

    async def main():
        async with AsyncEngineClient(served.server.url) as raw:
            client = CoalescingClient(raw)
            results = await asyncio.gather(
                client.generate(ids, **bad_media, sampling_params={"max_new_tokens": 2}),
                client.generate(ids, **media, sampling_params={"max_new_tokens": 2}),
                client.generate(ids2, **media2, sampling_params={"max_new_tokens": 2}),
                return_exceptions=True)
            return client.stats, results

    stats, results = asyncio.run(main())
    assert isinstance(results[0], EngineHTTPError) and results[0].status_code == 400
    assert "video" in results[0].message
    assert [len(r.output_ids) for r in results[1:]] == [2, 2]
    assert stats["fallback_batches"] == 1


def test_an_unreachable_server_fails_every_caller():
    async def main():
        async with AsyncEngineClient("http://127.0.0.1:9", retries=0) as raw:  # port 9 (discard): nothing listens
            client = CoalescingClient(raw)
            return await asyncio.gather(*(client.generate([1, 2, 3], sampling_params={"max_new_tokens": 1}) for _ in range(3)),
                                        return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, EngineConnectionError) for r in results)


def test_max_batch_sends_without_waiting(served):
    ids = served.processor.encode_text("short prompt")

    async def main():
        async with AsyncEngineClient(served.server.url) as raw:
            client = CoalescingClient(raw, window_s=5.0, max_wait_s=5.0, max_batch=4)  # only the cap can send it
            outs = await asyncio.wait_for(asyncio.gather(*(client.generate(ids, sampling_params={"max_new_tokens": 1}) for _ in range(4))), 30)
            return client.stats, outs

    stats, outs = asyncio.run(main())
    assert stats["batches"] == 1 and len(outs) == 4


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="window_s"):
        CoalescingClient(None, window_s=0.1, max_wait_s=0.01)  # type: ignore[arg-type]
