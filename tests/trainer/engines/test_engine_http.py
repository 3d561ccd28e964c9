"""The client against the embedded engine over real loopback HTTP: text and multimodal prompts, log-probs equal
to a training forward, greedy determinism, stop strings / ids, lengths, batching, pause / continue / abort,
errors and health."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.engines.client import EngineHTTPError
from relax_gym.trainer.engines.media_items import media_data

from .conftest import reference_greedy, training_logprobs

GREEDY = {"temperature": 0.0}


def _prompt(processor, text: str) -> list[int]:
    return processor.encode_text(text)


def test_text_prompt(served):
    ids = _prompt(served.processor, "Count the apples: one, two,")
    out = served.client.generate(ids, sampling_params={"max_new_tokens": 6, "temperature": 0.7, "top_p": 0.9})
    assert 1 <= len(out.output_ids) <= 6 and len(out.output_logprobs) == len(out.output_ids)
    assert all(lp <= 0 for lp in out.output_logprobs)
    assert out.finish_type in ("stop", "length") and out.weight_version == "0" and out.prompt_tokens == len(ids)
    assert not set(out.output_ids) & set(served.processor.control_token_ids)
    by_text = served.client.generate(text="Count the apples: one, two,", sampling_params={"max_new_tokens": 4, **GREEDY})
    by_ids = served.client.generate(ids, sampling_params={"max_new_tokens": 4, **GREEDY})
    assert by_text.output_ids == by_ids.output_ids and by_text.prompt_tokens == len(ids)


@pytest.mark.parametrize("temperature, extra", [(0.7, {"top_p": 0.8, "top_k": 20}), (1.3, {"min_p": 0.01}), (0.0, {})])
def test_logprobs_match_a_training_forward(served, temperature, extra):
    ids = _prompt(served.processor, "The weather today is")
    out = served.client.generate(ids, sampling_params={"max_new_tokens": 12, "temperature": temperature, "ignore_eos": True, **extra})
    assert len(out.output_ids) == 12
    ref = training_logprobs(served.model, served.processor, ids, {}, out.output_ids, temperature or 1.0)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=0)


def test_multimodal_video_observation(served):
    """A nextqa-video observation rendered with ``render``; the video goes as {"url": "file://...", "sampling"}."""
    obs, _ = relax_gym.make("nextqa-video").reset(seed=1)
    rendered = render(obs, served.processor)
    media = media_data(obs)
    (video,) = media["video_data"]
    assert video["url"].startswith("file://") and video["sampling"]["max_frames"] == 16
    out = served.client.generate(rendered.input_ids, **media, sampling_params={"max_new_tokens": 10, **GREEDY})
    assert out.output_ids == reference_greedy(served.model, served.processor, [rendered], 10)[0]
    ref = training_logprobs(served.model, served.processor, rendered.input_ids, rendered.mm, out.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=0)


def test_multimodal_image_and_audio_sampled(served):
    obs, _ = relax_gym.make("echo-ink").reset(seed=2)
    rendered = render(obs, served.processor)
    out = served.client.generate(rendered.input_ids, **media_data(obs),
                                 sampling_params={"max_new_tokens": 8, "temperature": 0.9, "ignore_eos": True})
    ref = training_logprobs(served.model, served.processor, rendered.input_ids, rendered.mm, out.output_ids, 0.9)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=0)


def test_greedy_is_deterministic(served):
    ids = _prompt(served.processor, "Once upon a time")
    runs = [served.client.generate(ids, sampling_params={"max_new_tokens": 16, **GREEDY}) for _ in range(3)]
    assert runs[0].output_ids == runs[1].output_ids == runs[2].output_ids
    assert runs[0].output_logprobs == runs[1].output_logprobs
    rendered = type("R", (), {"input_ids": ids, "loss_mask": [0] * len(ids), "mm": {}})()
    assert runs[0].output_ids == reference_greedy(served.model, served.processor, [rendered], 16)[0]


def _long_greedy(served, text: str, n: int = 24):
    ids = _prompt(served.processor, text)
    out = served.client.generate(ids, sampling_params={"max_new_tokens": n, "ignore_eos": True, **GREEDY})
    assert out.finish_reason == {"type": "length", "length": n}
    return ids, out.output_ids


def test_stop_token_ids(served):
    ids, full = _long_greedy(served, "List three colours:")
    stop_id = full[4]
    first = full.index(stop_id)
    out = served.client.generate(ids, sampling_params={"max_new_tokens": 24, "stop_token_ids": [stop_id], **GREEDY})
    assert out.output_ids == full[: first + 1]
    assert out.finish_reason == {"type": "stop", "matched": stop_id}
    decode = served.processor.decode
    assert out.text == decode(full[:first], skip_special_tokens=True)
    kept = served.client.generate(ids, sampling_params={"max_new_tokens": 24, "stop_token_ids": [stop_id],
                                                         "no_stop_trim": True, "skip_special_tokens": False, **GREEDY})
    assert kept.text == decode(full[: first + 1], skip_special_tokens=False)


def test_stop_strings(served):
    decode = served.processor.decode
    for text in ("List three colours:", "Name a city:", "Tell me a story", "Why is the sky blue?"):
        ids, full = _long_greedy(served, text)
        whole = decode(full, skip_special_tokens=True)
        # a stop string: the text of a later token that is plain and does not occur earlier
        candidates = [decode([t]) for t in full[3:12]]
        stop = next((c for c in candidates if len(c.strip()) >= 2 and c.isprintable() and "\ufffd" not in c), None)
        if stop is not None:
            break
    assert stop is not None, "no usable stop string in four greedy samples"
    end = next(j for j in range(len(full)) if stop in decode(full[: j + 1], skip_special_tokens=False))
    out = served.client.generate(ids, sampling_params={"max_new_tokens": 24, "stop": [stop, "\x00never"], **GREEDY})
    assert out.finish_reason == {"type": "stop", "matched": stop}
    assert out.output_ids == full[: end + 1]  # the ids keep the token that completed the stop string
    assert out.text == decode(full[: end + 1], skip_special_tokens=True).split(stop)[0] and stop not in out.text
    kept = served.client.generate(ids, sampling_params={"max_new_tokens": 24, "stop": stop, "no_stop_trim": True, **GREEDY})
    assert kept.text.endswith(stop) or stop in kept.text
    assert whole.startswith(out.text)


def test_max_new_tokens_finishes_with_length(served):
    ids = _prompt(served.processor, "Write a long essay")
    out = served.client.generate(ids, sampling_params={"max_new_tokens": 5, "ignore_eos": True, "temperature": 1.0})
    assert len(out.output_ids) == 5 and out.completion_tokens == 5
    assert out.finish_reason == {"type": "length", "length": 5}
    zero = served.client.generate(ids, sampling_params={"max_new_tokens": 0})
    assert zero.output_ids == [] and zero.finish_type == "length"


def test_batch_request_and_concurrent_requests_are_batched(served):
    texts = [f"Question {i}: what is {i} plus {i * 3}?" + " Think." * (i % 4) for i in range(16)]
    prompts = [_prompt(served.processor, t) for t in texts]
    params = [{"max_new_tokens": 4 + i % 5, "ignore_eos": True, **GREEDY} for i in range(16)]
    before = served.engine.stats()
    results: list = [None] * 16

    def run(i: int) -> None:
        results[i] = served.client.generate(prompts[i], sampling_params=params[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    after = served.engine.stats()
    assert after["requests"] - before["requests"] == 16
    assert after["batches"] - before["batches"] < 16 and after["max_batch_seen"] > 1
    alone = [served.client.generate(prompts[i], sampling_params=params[i]) for i in range(16)]
    for i in range(16):
        assert results[i].output_ids == alone[i].output_ids, i
        assert len(results[i].output_ids) == params[i]["max_new_tokens"]
        torch.testing.assert_close(torch.tensor(results[i].output_logprobs), torch.tensor(alone[i].output_logprobs), atol=1e-4, rtol=0)
    # one HTTP batch request, mixed sampling params, gives the same
    batch = served.client.generate_batch(prompts[:4], sampling_params=params[:4])
    assert [b.output_ids for b in batch] == [a.output_ids for a in alone[:4]]


def test_pause_and_continue(served):
    ids = _prompt(served.processor, "Pause test")
    served.client.pause_generation("in_place")
    try:
        box: dict = {}
        thread = threading.Thread(target=lambda: box.setdefault("out", served.client.generate(ids, sampling_params={"max_new_tokens": 3, **GREEDY})))
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive() and "out" not in box  # waits while paused
        assert served.client.health_generate()  # health does not block on a pause
    finally:
        served.client.continue_generation()
    thread.join(10)
    assert box["out"].finish_type in ("stop", "length") and len(box["out"].output_ids) >= 1


def test_pause_with_abort_ends_running_requests(served):
    ids = _prompt(served.processor, "Abort test")
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", served.client.generate(
        ids, sampling_params={"max_new_tokens": 5000, "ignore_eos": True, **GREEDY})))
    calls = served.engine.stats()["generate_calls"]
    thread.start()
    deadline = time.monotonic() + 60
    while served.engine.stats()["generate_calls"] < calls + 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # until it has decoded past its prefill: some tokens out before the abort
    served.client.pause_generation("abort")
    try:
        thread.join(10)
        out = box["out"]
        assert out.finish_type == "abort" and 0 < len(out.output_ids) < 5000
        assert len(out.output_logprobs) == len(out.output_ids)
        assert not served.engine.stats()["running"]
    finally:
        served.client.continue_generation()
    assert served.client.generate(ids, sampling_params={"max_new_tokens": 2, **GREEDY}).finish_type != "abort"


def test_bad_requests_answer_400_naming_the_field(served):
    client = served.client
    with pytest.raises(EngineHTTPError) as info:
        client.generate([1, 2, 3], sampling_params={"max_new_tokens": -1})
    assert info.value.status_code == 400 and "sampling_params.max_new_tokens" in info.value.message
    with pytest.raises(EngineHTTPError) as info:
        client.generate_batch([[1, 2], [3]], sampling_params={"max_new_tokens": 2}, stream=True)
    assert info.value.status_code == 400 and "stream=True takes one request, not a batch of 2" in info.value.message
    with pytest.raises(ValueError, match="on_token"):  # the client streams through on_token, not a bare flag
        client.generate([1, 2, 3], sampling_params={"max_new_tokens": 2}, stream=True)
    with pytest.raises(EngineHTTPError) as info:
        client.generate([10 ** 7], sampling_params={"max_new_tokens": 2})
    assert info.value.status_code == 400 and "vocabulary" in info.value.message
    raw = httpx.post(f"{served.server.url}/generate", content=b"{not json", headers={"Content-Type": "application/json"})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["message"]
    assert httpx.get(f"{served.server.url}/no_such_endpoint").status_code == 404
    assert httpx.get(f"{served.server.url}/generate").status_code == 405
    assert client.generate([5, 6], sampling_params={"max_new_tokens": 1}).completion_tokens == 1  # still serving


def test_media_count_mismatch_is_400(served):
    obs, _ = relax_gym.make("echo-ink").reset(seed=0)
    rendered = render(obs, served.processor)
    media = media_data(obs)
    with pytest.raises(EngineHTTPError) as info:  # the audio item left out
        served.client.generate(rendered.input_ids, image_data=media["image_data"], sampling_params={"max_new_tokens": 2}, rid="req-a")
    assert info.value.status_code == 400 and "req-a" in info.value.message and "<|AUDIO|>" in info.value.message
    with pytest.raises(EngineHTTPError) as info:  # the image twice
        served.client.generate(rendered.input_ids, image_data=media["image_data"] * 2, audio_data=media["audio_data"],
                               sampling_params={"max_new_tokens": 2})
    assert info.value.status_code == 400 and "<|IMAGE|>" in info.value.message
    with pytest.raises(EngineHTTPError) as info:
        served.client.generate(rendered.input_ids, image_data=["/no/such/image.png"], audio_data=media["audio_data"],
                               sampling_params={"max_new_tokens": 2})
    assert info.value.status_code == 400 and "image_data[0]" in info.value.message


def test_health_and_info_endpoints(served):
    client = served.client
    assert client.health() and client.health_generate()
    client.wait_healthy(5)
    assert httpx.get(f"{served.server.url}/health_generate").status_code == 200
    assert client.flush_cache()
    assert httpx.get(f"{served.server.url}/flush_cache").status_code == 200
    info = client.get_model_info()
    assert info["is_generation"] is True and info["weight_version"] == served.engine.weight_version
    server = client.get_server_info()
    assert server["max_batch"] == 16 and server["stats"]["requests"] >= 0


def _raw_exchange(url: str, request: bytes) -> tuple[bytes, bytes, bytes]:
    """One request on a fresh socket; returns the response's head and body, and what a second request on the same
    socket gets (b'' once the server has closed it)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += sock.recv(65536)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            second = sock.recv(65536)
        except OSError:
            second = b""
    return head, rest, second


def test_error_responses_say_whether_the_connection_stays_open(served):
    # a body that was read in full but is not JSON: 400, and the keep-alive socket keeps serving
    head, _, second = _raw_exchange(served.server.url, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{not json")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" not in head.lower()
    assert second.startswith(b"HTTP/1.1 200")
    # a body that was not read (too large): the server closes, and says so, so a client never reuses the socket
    head, _, second = _raw_exchange(served.server.url, b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{}")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert second == b""
    head, body, _ = _raw_exchange(served.server.url, b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower() and b"bad chunk size" in body
