"""Continuous batching (relax_gym/trainer/engines/continuous.py): the same answers as static batches, rows that join a
running batch decode as if alone, and an ended row leaves at once."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.media_items import media_data


@pytest.fixture(scope="module")
def engines(policy):
    model, processor = policy
    with (EmbeddedEngine(copy.deepcopy(model), processor, max_batch=8, continuous=True) as cont,
          EmbeddedEngine(copy.deepcopy(model), processor, max_batch=8, continuous=False) as static):
        yield cont, static


def _request(processor, env_id: str, seed: int, sampling: dict) -> dict:
    env = relax_gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    env.close()
    return {"input_ids": render(obs, processor).input_ids, **media_data(obs), "sampling_params": sampling,
            "return_logprob": True, "top_logprobs_num": 2}


def _same(a, b) -> None:
    assert a.output_ids == b.output_ids and a.meta_info.finish_reason == b.meta_info.finish_reason
    for (x, t, _), (y, u, _) in zip(a.meta_info.output_token_logprobs, b.meta_info.output_token_logprobs):
        assert t == u and x == pytest.approx(y, abs=1e-4)
    for xs, ys in zip(a.meta_info.output_top_logprobs, b.meta_info.output_top_logprobs):
        assert [i for _, i, _ in xs] == [i for _, i, _ in ys]


def _batch(requests: list[dict]) -> dict:
    """One batch request of SGLang's protocol: per-request media lists (None where a request has none)."""
    body = {"input_ids": [r["input_ids"] for r in requests], "sampling_params": [r["sampling_params"] for r in requests]}
    for kind in ("image_data", "video_data", "audio_data"):
        if any(kind in r for r in requests):
            body[kind] = [r.get(kind) for r in requests]
    return {**body, "return_logprob": True, "top_logprobs_num": 2}


def test_greedy_answers_equal_the_static_engines(engines):
    cont, static = engines
    p = cont.processor
    requests = [_request(p, "nextqa-video", 0, {"max_new_tokens": 7, "temperature": 0}),
                _request(p, "echo-ink", 2, {"max_new_tokens": 3, "temperature": 0}),
                _request(p, "nextqa-video", 0, {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}),
                _request(p, "tool-use", 1, {"max_new_tokens": 9, "temperature": 0, "stop": ["a"]}),
                {"input_ids": p.encode_text("short"), "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                 "top_logprobs_num": 2}]
    body = _batch(requests)
    for a, b in zip(cont.generate(body), static.generate(body)):
        _same(a, b)


def test_a_request_joins_a_running_batch_and_decodes_as_if_alone(engines):
    """A long answer is running (paused in place after some steps); a short request with media and a longer prompt
    arrives: it joins the running batch (one batch of two), is answered first, and both answers equal the ones
    each request gets alone."""
    cont, _ = engines
    p = cont.processor
    long = {"input_ids": p.encode_text("a long answer"), "sampling_params": {"max_new_tokens": 48, "temperature": 0,
                                                                             "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2}
    short = _request(p, "echo-ink", 5, {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
    alone = [cont.generate(long), cont.generate(short)]
    answers: dict[str, object] = {}
    order: list[str] = []

    def ask(name: str, body: dict) -> None:
        answers[name] = cont.generate(body)
        order.append(name)

    seen = cont.stats()["max_batch_seen"]
    cont._stats["max_batch_seen"] = 0
    calls = cont.stats()["generate_calls"]
    first = threading.Thread(target=ask, args=("long", long))
    first.start()
    deadline = time.monotonic() + 30
    while cont.stats()["generate_calls"] < calls + 4 and time.monotonic() < deadline:  # admitted and decoding
        time.sleep(0.001)
    cont.pause("in_place")  # between two steps: the long row stays in the batch
    assert len(cont._batch) == 1 and not answers
    second = threading.Thread(target=ask, args=("short", short))
    second.start()
    while cont.stats()["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    cont.resume()
    first.join(30)
    second.join(30)
    assert order == ["short", "long"] and cont.stats()["max_batch_seen"] == 2
    cont._stats["max_batch_seen"] = max(seen, 2)
    _same(answers["long"], alone[0])
    _same(answers["short"], alone[1])


def test_sampling_is_reproducible_and_rows_of_one_prompt_differ(engines):
    cont, _ = engines
    ids = cont.processor.encode_text("sample me")
    body = {"input_ids": [ids] * 4, "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.9},
            "return_logprob": True}
    torch.manual_seed(3)
    a = cont.generate(body)
    torch.manual_seed(3)
    b = cont.generate(body)
    assert [o.output_ids for o in a] == [o.output_ids for o in b]
    assert len({tuple(o.output_ids) for o in a}) > 1
    assert all(lp is not None and lp <= 0 for o in a for lp, _, _ in o.meta_info.output_token_logprobs)


def test_an_abort_answers_running_rows_with_what_they_have(engines):
    cont, _ = engines
    ids = cont.processor.encode_text("abort me")
    result: list = []
    t = threading.Thread(target=lambda: result.append(cont.generate(
        {"input_ids": ids, "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}})))
    calls = cont.stats()["generate_calls"]
    t.start()
    deadline = time.monotonic() + 30
    while cont.stats()["generate_calls"] < calls + 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    cont.pause("abort")
    t.join(30)
    cont.resume()
    (out,) = result
    assert out.meta_info.finish_reason.type == "abort" and 0 < len(out.output_ids) < 64
    assert len(cont._batch) == 0


def test_an_moe_policy_keeps_static_rounds(policy):
    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    model, processor = build_policy(PolicyConfig(family="qwen3_omni_moe"))
    with EmbeddedEngine(model, processor) as e:
        assert e.moe and not e.continuous
        with pytest.raises(ValueError, match="routed experts"):
            EmbeddedEngine(model, processor, continuous=True)
