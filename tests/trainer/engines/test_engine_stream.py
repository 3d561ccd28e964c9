"""The embedded engine streams: ``on_token`` gets each id as the running batch samples it (the same ids as the
answer, in order), ``/generate`` with ``stream: true`` sends SGLang's cumulative events, and the async client reads
them into the same answer as a non-streamed call. Each streamed token is handed out before the request ends
(ordered by an event, not a clock)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from relax_gym.omni import Message, TextPart
from relax_gym.trainer.engines.client import AsyncEngineClient, EngineHTTPError, with_engine_token

GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def prompt(served):
    return list(served.engine.render([Message(role="user", content=(TextPart("Tell me about the sea."),))]).input_ids)


def test_on_token_hands_out_each_id_before_the_request_ends_and_equals_the_answer(served, prompt):
    seen: list[int] = []
    first = threading.Event()
    done = threading.Event()
    before_end: list[bool] = []

    def on_token(token: int) -> None:
        seen.append(token)
        before_end.append(not done.is_set())
        first.set()

    out = served.engine.generate_rendered(prompt, None, sampling_params=GREEDY, on_token=on_token)
    done.set()
    plain = served.engine.generate_rendered(prompt, None, sampling_params=GREEDY)
    assert seen == out.output_ids == plain.output_ids and len(seen) == GREEDY["max_new_tokens"]
    assert first.is_set() and all(before_end)


def test_a_listener_that_fails_is_dropped_and_the_request_still_answers_whole(served, prompt):
    calls = []

    def broken(token: int) -> None:
        calls.append(token)
        raise RuntimeError("the client went away")

    out = served.engine.generate_rendered(prompt, None, sampling_params=GREEDY, on_token=broken)
    assert len(calls) == 1 and len(out.output_ids) == GREEDY["max_new_tokens"]


def test_generate_streams_sglang_events_and_the_async_client_reads_the_same_answer(served, prompt):
    async def both():
        client = AsyncEngineClient(served.server.url, timeout=60)
        try:
            got: list[int] = []
            streamed = await client.generate(prompt, sampling_params=GREEDY, return_logprob=True, on_token=got.append)
            plain = await client.generate(prompt, sampling_params=GREEDY, return_logprob=True)
            return got, streamed, plain
        finally:
            await client.aclose()

    got, streamed, plain = asyncio.run(both())
    assert got == streamed.output_ids == plain.output_ids
    assert streamed.text == plain.text and streamed.meta_info["output_token_logprobs"] == plain.meta_info["output_token_logprobs"]
    with httpx.Client(base_url=served.server.url, trust_env=False, timeout=60,
                      headers=with_engine_token(None)) as http:
        r = http.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY, "stream": True})
        lines = [ln[len("data: "):] for ln in r.text.split("\n\n") if ln]
        assert r.headers["content-type"] == "text/event-stream" and lines[-1] == "[DONE]"
        events = [json.loads(ln) for ln in lines[:-1]]
        assert [len(e["output_ids"]) for e in events[:-1]] == list(range(1, len(plain.output_ids) + 1))
        assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
        assert events[-1]["output_ids"] == plain.output_ids and events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_a_refused_stream_is_a_400_before_any_event_and_a_batch_cannot_stream(served, prompt):
    async def refused(body_extra):
        client = AsyncEngineClient(served.server.url, timeout=60)
        try:
            return await client.generate(prompt, sampling_params={**GREEDY, "max_new_tokens": 10**7},
                                         on_token=lambda t: None, **body_extra)
        finally:
            await client.aclose()

    with pytest.raises(EngineHTTPError) as err:
        asyncio.run(refused({}))
    assert err.value.status_code == 400 and "max_new_tokens" in str(err.value)
    with httpx.Client(base_url=served.server.url, trust_env=False, timeout=60,
                      headers=with_engine_token(None)) as http:
        r = http.post("/generate", json={"input_ids": [prompt, prompt], "sampling_params": GREEDY, "stream": True})
    assert r.status_code == 400 and "stream=True takes one request, not a batch of 2" in r.text


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_the_client_reads_cumulative_and_incremental_events_alike(incremental):
    """Our engine sends cumulative ids (SGLang's default); SGLang's incremental streaming output sends only the new
    ids (and log-probs) per event: both give every token once, in order, and a whole answer."""
    ids, lps = [5, 6, 7, 8], [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 7, None], [-0.4, 8, None]]
    events = []
    for n in (1, 3, 4):
        start = 0 if not incremental else {1: 0, 3: 1, 4: 3}[n]
        events.append({"text": "", "output_ids": ids[start:n], "meta_info": {
            "completion_tokens": n, "finish_reason": None if n < 4 else {"type": "length", "length": 4},
            "output_token_logprobs": lps[start:n], "weight_version": "1", "prompt_tokens": 2}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    def handler(request):
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    async def main():
        client = AsyncEngineClient("http://engine.test", transport=httpx.MockTransport(handler))
        try:
            got: list[int] = []
            out = await client.generate([1, 2], sampling_params={"max_new_tokens": 4}, on_token=got.append)
            return got, out
        finally:
            await client.aclose()

    got, out = asyncio.run(main())
    assert got == ids == out.output_ids
    assert [lp for lp, _, _ in out.meta_info["output_token_logprobs"]] == [-0.1, -0.2, -0.3, -0.4]
