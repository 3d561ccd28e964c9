"""The engine core without HTTP: request forms, tensor names, queued aborts, text prompts with placeholders."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

import relax_gym
from relax_gym.omni.render import render, to_template_dicts
from relax_gym.trainer.engines.embedded import EmbeddedEngine, EngineClosedError, EngineRequestError
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.engines.protocol import EngineRequest, GenerateResponse, SamplingParams


@pytest.fixture(scope="module")
def engine(policy):
    model, processor = policy
    with EmbeddedEngine(copy.deepcopy(model), processor, max_batch=4, batch_window_s=0.002) as e:
        yield e


def test_request_forms(engine):
    ids = engine.processor.encode_text("hello there")
    single = engine.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert isinstance(single, GenerateResponse) and single.meta_info.output_token_logprobs is None
    batch = engine.generate({"input_ids": [ids, ids[:2]], "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                             "return_logprob": True, "top_logprobs_num": 3, "return_text_in_logprobs": True})
    assert isinstance(batch, list) and batch[0].output_ids == single.output_ids
    top = batch[0].meta_info.output_top_logprobs
    assert len(top) == len(batch[0].output_ids) and all(len(step) == 3 for step in top)
    assert top[0][0][1] == batch[0].output_ids[0]  # greedy: the chosen token is the most likely one
    assert all(isinstance(entry[2], str) for entry in batch[0].meta_info.output_token_logprobs)
    direct = engine.generate([EngineRequest(rid="r", input_ids=ids, sampling_params=SamplingParams(max_new_tokens=3, temperature=0))])
    assert direct[0].output_ids == single.output_ids and direct[0].meta_info.id == "r"
    with pytest.raises(EngineRequestError, match="sampling_params.top_p"):
        engine.generate({"input_ids": ids, "sampling_params": {"top_p": 2}})


def test_tensor_names_runtime_checkpoint_and_thinker_prefix(engine, policy):
    model = policy[0]
    runtime = {k: v.clone() for k, v in model.state_dict().items() if "layers.0.mlp" in k}
    assert any(k.startswith("model.language_model.") for k in runtime)
    assert "Loaded" in engine.load_state_dict(runtime, "a")
    checkpoint = {k.replace("model.language_model.", "model."): v for k, v in runtime.items()}  # save_pretrained spelling
    engine.load_state_dict(checkpoint, "b")
    thinker = {f"thinker.{k}": v for k, v in checkpoint.items()} | {"talker.codec_head.weight": torch.zeros(2, 2)}
    message = engine.load_state_dict(thinker, "c")
    assert f"Loaded {len(runtime)} tensors" in message and engine.weight_version == "c"
    with pytest.raises(EngineRequestError, match="unknown tensor name"):
        engine.load_state_dict({"visual.nope": torch.zeros(1)})
    engine.update_weight_version("0")


def test_pause_abort_aborts_queued_requests_too(engine):
    ids = engine.processor.encode_text("queued")
    engine.pause("in_place")
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(engine.generate(
        {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}))) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while engine.stats()["queued"] < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    engine.pause("abort")
    for t in threads:
        t.join(5)
    engine.resume()
    assert len(results) == 2 and all(r.meta_info.finish_reason.type == "abort" and r.output_ids == [] for r in results)
    assert engine.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}).meta_info.finish_reason.type != "abort"


def test_text_prompt_with_one_placeholder_per_item(engine):
    obs, _ = relax_gym.make("echo-ink").reset(seed=4)
    processor = engine.processor
    text = processor.apply_chat_template(to_template_dicts(obs), add_generation_prompt=True)
    assert text.count("<|IMAGE|>") == 1 and text.count("<|AUDIO|>") == 1
    out = engine.generate({"text": text, **media_data(obs), "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    rendered = render(obs, processor)
    assert out.meta_info.prompt_tokens == len(rendered.input_ids)
    by_ids = engine.generate({"input_ids": rendered.input_ids, **media_data(obs), "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert by_ids.meta_info.prompt_tokens == len(rendered.input_ids)


def test_closed_engine_refuses(policy):
    model, processor = policy
    e = EmbeddedEngine(copy.deepcopy(model), processor)
    assert e.alive and e.health_check()
    e.close()
    assert not e.alive and not e.health_check()
    with pytest.raises(EngineClosedError):
        e.generate({"input_ids": [5], "sampling_params": {"max_new_tokens": 1}})
