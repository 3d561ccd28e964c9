"""The embedded engine's prefix cache (relax_gym/trainer/engines/prefix_cache.py): a request that continues an answered
one prefills only what is new and answers as if it had prefilled everything."""

from __future__ import annotations

import copy

import pytest
import torch

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.engines.prefix_cache import PrefixCache, PrefixEntry


@pytest.fixture(scope="module")
def engines(policy):
    model, processor = policy
    with (EmbeddedEngine(copy.deepcopy(model), processor, max_batch=8) as cached,
          EmbeddedEngine(copy.deepcopy(model), processor, max_batch=8, prefix_cache_tokens=0) as plain):
        yield cached, plain


def _turns(engine, first: dict, reply: list[int]) -> tuple:
    """Turn 1, then turn 2 = turn 1's ids + its answer + ``reply`` (a tool's answer), as an episode sends them."""
    one = engine.generate(first)
    second = {**first, "input_ids": first["input_ids"] + one.output_ids + reply}
    return one, engine.generate(second)


@pytest.mark.parametrize("env_id", ["tool-use", "echo-ink"])
def test_a_next_turn_prefills_only_what_is_new_and_answers_the_same(engines, env_id):
    cached, plain = engines
    p = cached.processor
    env = relax_gym.make(env_id)
    obs, _ = env.reset(seed=3)
    env.close()
    first = {"input_ids": render(obs, p).input_ids, **media_data(obs), "return_logprob": True, "top_logprobs_num": 2,
             "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    reply = p.encode_text("the tool says 42")
    before = cached.stats()
    a1, a2 = _turns(cached, first, reply)
    b1, b2 = _turns(plain, first, reply)
    after = cached.stats()
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 1
    # the answered row's cache: its prompt and all generated tokens but the last (never fed)
    assert after["prefix_cached_tokens"] - before["prefix_cached_tokens"] == len(first["input_ids"]) + 6 - 1
    assert plain.stats()["prefix_cache_hits"] == 0
    for a, b in ((a1, b1), (a2, b2)):
        assert a.output_ids == b.output_ids
        for (x, t, _), (y, u, _) in zip(a.meta_info.output_token_logprobs, b.meta_info.output_token_logprobs):
            assert t == u and x == pytest.approx(y, abs=1e-4)


def test_flush_and_a_new_weight_version_empty_it(engines):
    cached, _ = engines
    ids = cached.processor.encode_text("flush me")
    cached.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert len(cached._batch.prefix) > 0
    cached.flush_cache()
    assert len(cached._batch.prefix) == 0
    cached.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    cached.update_weight_version("7")
    assert len(cached._batch.prefix) == 0
    cached.update_weight_version("0")
    cached.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    same = {k: v.clone() for k, v in cached.model.state_dict().items() if "layers.0.mlp" in k}
    cached.load_state_dict(same)  # new weights under the same version string: the entries go too
    assert len(cached._batch.prefix) == 0


def test_an_ended_rows_kv_is_stored_before_its_answer_goes_out(engines, monkeypatch):
    """A client that sends its next turn the moment it has the answer must find the cache filled: the engine thread
    stores the row's KV, then answers (not the other way round)."""
    cached, _ = engines
    cached.flush_cache()
    seen = []
    resolve = cached._resolve

    def watching(p, *args, **kwargs):
        seen.append(len(cached._batch.prefix))  # on the engine thread, as the answer is handed over
        return resolve(p, *args, **kwargs)

    monkeypatch.setattr(cached, "_resolve", watching)
    ids = cached.processor.encode_text("answer after storing")
    cached.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
    assert seen == [1]


def _entry(ids, version="1", mm=None, n_layers=2):
    kv = torch.zeros(1, 2, len(ids), 4)
    return PrefixEntry(tuple(ids), tuple((kv, kv) for _ in range(n_layers)), 0, mm or {}, version)


def test_take_needs_the_longest_continued_prefix_same_weights_same_media_and_no_new_media():
    picture = {"pixel_values": torch.arange(6.0).reshape(2, 3)}
    cache = PrefixCache(max_tokens=100)
    cache.put(_entry([1, 2], mm=picture))
    cache.put(_entry([1, 2, 3, 4], mm=picture))
    other = {"pixel_values": picture["pixel_values"] + 1}
    assert cache.take([1, 2, 3, 4, 5], other, "1", set()) is None  # same ids, another picture
    assert cache.take([1, 2, 3, 4, 5], picture, "2", set()) is None  # other weights
    assert cache.take([1, 2, 3, 4, 9], picture, "1", {9}) is None  # the new part holds a media placeholder
    got = cache.take([1, 2, 3, 4, 5], picture, "1", set())
    assert got is not None and got.ids == (1, 2, 3, 4)  # the longest
    # an entry as long as the prompt is no continuation of it (nothing would be left to prefill)
    cache.put(_entry([1, 2, 3], mm=picture))
    assert cache.take([1, 2, 3], picture, "1", set()).ids == (1, 2)  # taken entries leave
    assert len(cache) == 1 and cache.tokens == 3


def test_the_cache_keeps_at_most_max_tokens_dropping_the_oldest():
    cache = PrefixCache(max_tokens=10)
    cache.put(_entry(range(4)))
    cache.put(_entry(range(10, 14)))
    cache.put(_entry(range(20, 24)))  # 12 tokens: the oldest goes
    assert cache.tokens == 8 and cache.take([*range(4), 99], {}, "1", set()) is None
    assert cache.take([*range(20, 24), 99], {}, "1", set()) is not None
    cache.put(_entry(range(50)))  # longer than the whole cache: not kept
    assert cache.tokens == 4
