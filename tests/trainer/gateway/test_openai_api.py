"""The OpenAI-compatible endpoint over real loopback HTTP (httpx): chat completions with text and image parts,
the extra token ids / log-probs, the session recorder (HTTP and Python), errors that name the field."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from relax_gym.omni import ImagePart, from_openai
from relax_gym.omni.render import render
from relax_gym.trainer.gateway.api import SessionRecorder

from ..engines.conftest import training_logprobs


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served.server.url, timeout=60) as client:
        yield client


def png_data_url(seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGE_MESSAGES = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                 {"type": "image_url", "image_url": {"url": png_data_url()}}]},
]


def chat(http, headers=None, **body):
    body = {"model": "policy", "messages": [{"role": "user", "content": "Say hello."}], **body}
    return http.post("/v1/chat/completions", json=body, headers=headers or {})


def test_text_chat_is_openai_shaped(served, http):
    r = chat(http, max_tokens=6, temperature=0.0)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["object"] == "chat.completion" and d["id"].startswith("chatcmpl-") and d["model"] == "policy"
    assert isinstance(d["created"], int)
    (choice,) = d["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    n = len(choice["token_ids"])
    assert 1 <= n <= 6 and len(choice["token_logprobs"]) == n and all(lp <= 0 for lp in choice["token_logprobs"])
    expected = render(from_openai([{"role": "user", "content": "Say hello."}]), served.processor).input_ids
    assert d["prompt_token_ids"] == expected
    assert d["usage"] == {"prompt_tokens": len(expected), "completion_tokens": n, "total_tokens": len(expected) + n}
    assert d["relax"]["weight_version"] == served.engine.weight_version
    again = chat(http, max_tokens=6, temperature=0.0).json()
    assert again["choices"][0]["token_ids"] == choice["token_ids"]  # greedy is deterministic


def test_image_chat_is_recorded_with_matching_ids_and_logprobs(served, http):
    r = chat(http, headers={"X-Relax-Session": "episode-1"}, messages=IMAGE_MESSAGES, max_completion_tokens=8,
             temperature=0.8, top_p=0.95, logprobs=True, top_logprobs=2)
    assert r.status_code == 200, r.text
    assert r.headers["X-Relax-Session"] == "episode-1"
    d = r.json()
    (choice,) = d["choices"]
    rendered = render(from_openai(IMAGE_MESSAGES), served.processor)
    assert d["prompt_token_ids"] == rendered.input_ids
    image_pad = served.processor.media_token_ids["image"]
    assert d["prompt_token_ids"].count(image_pad) > 1  # the image's pad tokens, expanded
    content = choice["logprobs"]["content"]
    assert [c["logprob"] for c in content] == choice["token_logprobs"]
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"] for c in content)
    # the log-probs are those of the sampling distribution on the served weights (the image included)
    ref = training_logprobs(served.model, served.processor, rendered.input_ids, rendered.mm, choice["token_ids"], 0.8)
    torch.testing.assert_close(torch.tensor(choice["token_logprobs"]), ref, atol=1e-4, rtol=0)

    session = http.get("/v1/relax/sessions/episode-1").json()
    assert session["id"] == "episode-1"
    (call,) = session["calls"]
    assert call["prompt_ids"] == d["prompt_token_ids"] and call["completion_ids"] == choice["token_ids"]
    assert call["logprobs"] == choice["token_logprobs"] and call["text"] == choice["message"]["content"]
    assert call["finish_reason"] == choice["finish_reason"] and call["request_id"] == d["id"]
    (image,) = call["media"]
    assert image["type"] == "image_url" and image["image_url"]["url"] == IMAGE_MESSAGES[1]["content"][1]["image_url"]["url"]

    (record,) = served.server.openai.recorder.get("episode-1")  # the same, in process
    assert isinstance(record.media[0], ImagePart) and record.prompt_ids == d["prompt_token_ids"]


def test_sessions_by_user_field_header_precedence_and_delete(served, http):
    for _ in range(2):
        assert chat(http, user="agent-7", max_tokens=2).status_code == 200
    r = chat(http, headers={"x-relax-session": "agent-8"}, user="agent-7", max_tokens=2)
    assert r.json()["relax"] == {"session_id": "agent-8", "call_index": 0, "weight_version": served.engine.weight_version,
                                 "continues": False}
    calls = http.get("/v1/relax/sessions/agent-7").json()["calls"]
    assert [c["index"] for c in calls] == [0, 1] and all(c["media"] == [] for c in calls)
    listed = {s["id"]: s["calls"] for s in http.get("/v1/relax/sessions").json()["data"]}
    assert listed["agent-7"] == 2 and listed["agent-8"] == 1
    assert len(served.client.get_session("agent-8")["calls"]) == 1  # the Python client reads sessions too
    assert served.client.list_sessions()["agent-7"] == 2
    assert http.delete("/v1/relax/sessions/agent-7").json()["deleted"] is True
    gone = http.get("/v1/relax/sessions/agent-7")
    assert gone.status_code == 404 and "agent-7" in gone.json()["error"]["message"]
    assert http.delete("/v1/relax/sessions/agent-7").status_code == 404
    assert served.server.openai.recorder.drop("agent-8") is True


def test_stop_strings_end_the_completion(http):
    full = chat(http, max_tokens=10, temperature=0.0).json()["choices"][0]
    text = full["message"]["content"]
    stop = next(w for w in (text[i:i + 2] for i in range(2, len(text) - 1)) if w.isascii() and w.isprintable() and w.strip())
    cut = chat(http, max_tokens=10, temperature=0.0, stop=[stop]).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == text[: text.find(stop)]
    assert cut["token_ids"] == full["token_ids"][: len(cut["token_ids"])]


@pytest.mark.parametrize("body, field", [
    ({"temperature": 5}, "temperature"),
    ({"n": 2}, "n"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}, "messages"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_requests_name_the_field(http, body, field):
    r = chat(http, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    assert err["message"].startswith(field) and err["param"] == field


def test_malformed_bodies_and_other_routes(http, served):
    r = http.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json=[1, 2]).status_code == 400
    bad = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    headers={"X-Relax-Session": "a/b"})
    assert bad.status_code == 400 and "X-Relax-Session" in bad.json()["error"]["message"]
    assert http.get("/v1/chat/completions").status_code == 405
    assert http.get("/v1/nothing").status_code == 404
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == served.server.openai.model_name


def test_recorder_in_python():
    rec = SessionRecorder()
    fields = dict(request_id="r", created=0.0, prompt_ids=[1], completion_ids=[2], logprobs=[-0.5], media=(), text="t",
                  finish_reason="stop", weight_version="3")
    assert rec.record("s", **fields).index == 0 and rec.record("s", **fields).index == 1
    assert rec.sessions() == {"s": 2} and len(rec) == 1
    assert [c.index for c in rec.pop("s")] == [0, 1] and len(rec) == 0
    with pytest.raises(KeyError, match="'s'"):
        rec.get("s")
    assert rec.drop("s") is False
