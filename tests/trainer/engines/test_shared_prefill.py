"""Shared prefill: a batch with repeated prompts (a GRPO group) gives the same completions and log-probs as the
unshared batch, prefills each distinct prompt once, and still samples every row on its own."""

from __future__ import annotations

import copy

import pytest
import torch

import relax_gym
from relax_gym.omni.render import render
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.engines.shared_prefill import plan_sharing


def _requests(processor, env_id: str, seeds: list[int], sampling: dict) -> list[dict]:
    env = relax_gym.make(env_id)
    out = []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        out.append({"input_ids": render(obs, processor).input_ids, **media_data(obs), "sampling_params": sampling,
                    "return_logprob": True})
    env.close()
    return out


@pytest.fixture(scope="module")
def engines(policy):
    model, processor = policy
    shared = EmbeddedEngine(copy.deepcopy(model), processor, max_batch=64, batch_window_s=0.05)
    plain = EmbeddedEngine(copy.deepcopy(model), processor, max_batch=64, batch_window_s=0.05, share_prefill=False)
    yield shared, plain
    shared.close()
    plain.close()


def _batch(engine, requests):
    merged = {k: [r[k] for r in requests] for k in requests[0] if k not in ("sampling_params", "return_logprob")}
    merged = {k: (sum(v, []) if k.endswith("_data") else v) for k, v in merged.items()}
    return engine.generate({**merged, "sampling_params": requests[0]["sampling_params"], "return_logprob": True})


@pytest.mark.parametrize("env_id", ["nextqa-video", "echo-ink"])
def test_greedy_equals_the_unshared_batch(engines, env_id):
    shared, plain = engines
    greedy = {"max_new_tokens": 6, "temperature": 0}
    requests = _requests(shared.processor, env_id, [0, 0, 1, 0, 1, 3], greedy)  # three distinct prompts, two of them repeated
    before = shared.stats()["shared_prefill_rows"]
    a, b = _batch(shared, requests), _batch(plain, requests)
    assert shared.stats()["shared_prefill_rows"] - before == 3
    assert plain.stats()["shared_prefill_rows"] == 0
    for x, y in zip(a, b):
        assert x.output_ids == y.output_ids
        lx = torch.tensor([lp for lp, _, _ in x.meta_info.output_token_logprobs])
        ly = torch.tensor([lp for lp, _, _ in y.meta_info.output_token_logprobs])
        assert torch.allclose(lx, ly, atol=1e-4), (lx - ly).abs().max()
    assert a[0].output_ids == a[1].output_ids == a[3].output_ids  # the same prompt, greedy


def test_rows_of_one_prompt_sample_independently(engines):
    shared, _ = engines
    requests = _requests(shared.processor, "nextqa-video", [3] * 8, {"max_new_tokens": 8, "temperature": 1.0})
    before = shared.stats()["shared_prefill_rows"]
    out = _batch(shared, requests)
    assert shared.stats()["shared_prefill_rows"] - before == 7
    assert len({tuple(o.output_ids) for o in out}) > 1


def test_plan_needs_equal_ids_and_bit_equal_media():
    ids = [5, 6, 7]
    mm = {"pixel_values": torch.arange(12.0).reshape(3, 4)}
    other = {"pixel_values": mm["pixel_values"].clone()}
    other["pixel_values"][2, 3] += 1e-3  # one value off: another prompt, even if the strided sample misses it
    plan = plan_sharing([(ids, mm), (list(ids), {"pixel_values": mm["pixel_values"].clone()}), (ids, other), ([5, 6, 8], mm)], set())
    assert plan is not None and plan.unique == [0, 2, 3] and plan.index.tolist() == [0, 0, 1, 2]
    assert plan_sharing([(ids, mm), ([5, 6, 8], mm)], set()) is None  # nothing repeats
    assert plan_sharing([(ids, mm), (ids, mm)], {7}) is None  # ends with a media placeholder
    assert plan_sharing([([5], {}), ([5], {})], set()) is None  # too short to split off a last token
