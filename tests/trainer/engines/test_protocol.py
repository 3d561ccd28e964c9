"""SGLang-shaped JSON through the protocol models: requests as trainers send them, responses as SGLang answers."""

from __future__ import annotations

import base64
import json
import pickle

import pytest
import torch

import relax_gym
from relax_gym.trainer.engines.client import GenerateOutput
from relax_gym.trainer.engines.admin_protocol import InitWeightsUpdateGroupReqInput, PauseGenerationReqInput, UpdateWeightFromDiskReqInput, UpdateWeightVersionReqInput, UpdateWeightsFromDistributedReqInput, UpdateWeightsFromTensorReqInput, deserialize_named_tensors, serialize_named_tensors
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.engines.protocol import GenerateReqInput, GenerateResponse
from relax_gym.trainer.engines.validation import parse_request

# What RL trainers post to SGLang's /generate (slime- and verl-style payloads).
SLIME_LIKE = {
    "input_ids": [151644, 872, 198, 151652, 151655, 151655, 151653, 151645],
    "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 1024, "stop": None,
                        "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
                        "spaces_between_special_tokens": False},
    "return_logprob": True,
    "image_data": ["file:///tmp/a.png"],
}
VERL_LIKE_BATCH = {
    "input_ids": [[1, 2, 3], [4, 5]],
    "sampling_params": {"n": 1, "max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                        "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                        "min_new_tokens": 0, "ignore_eos": False, "stop": ["</answer>"]},
    "return_logprob": True, "logprob_start_len": -1, "image_data": None, "stream": False, "rid": "batch7",
    "lora_path": None, "modalities": None, "return_text_in_logprobs": False,
}
# A /generate answer of a real SGLang server.
SGLANG_RESPONSE = {
    "text": " Paris.", "output_ids": [12366, 13, 151645],
    "meta_info": {"id": "8f1c", "finish_reason": {"type": "stop", "matched": 151645}, "prompt_tokens": 12,
                  "weight_version": "default", "total_retractions": 0, "completion_tokens": 3, "cached_tokens": 0,
                  "e2e_latency": 0.031, "response_sent_to_client_ts": 1.7e9,
                  "output_token_logprobs": [[-0.12, 12366, None], [-0.01, 13, None], [-0.5, 151645, None]]},
}


def test_single_request_as_trainers_send_it():
    req = parse_request(GenerateReqInput, SLIME_LIKE)
    assert not req.is_batch
    (one,) = req.split()
    assert one.input_ids == SLIME_LIKE["input_ids"] and one.return_logprob
    assert one.sampling_params.top_k == -1 and one.sampling_params.no_stop_trim and one.sampling_params.stop_strings == []
    assert [item.url for item in one.media["image"]] == ["file:///tmp/a.png"]


def test_batch_request_splits_per_request():
    req = parse_request(GenerateReqInput, VERL_LIKE_BATCH)
    assert req.is_batch and req.batch_size == 2
    reqs = req.split()
    assert [r.input_ids for r in reqs] == [[1, 2, 3], [4, 5]]
    assert [r.rid for r in reqs] == ["batch7_0", "batch7_1"]
    assert all(r.sampling_params.greedy and r.sampling_params.stop_strings == ["</answer>"] for r in reqs)
    mixed = parse_request(GenerateReqInput, {
        "text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2, "temperature": 0.5}],
        "audio_data": [None, [{"url": "data:audio/wav;base64,AAAA", "sampling": {"sample_rate": 16000}}]],
        "return_logprob": [True, False], "rid": ["x", "y"]})
    a, b = mixed.split()
    assert (a.text, b.text, a.return_logprob, b.return_logprob) == ("a", "b", True, False)
    assert a.media == {} and b.media["audio"][0].sampling == {"sample_rate": 16000}
    assert b.sampling_params.warper_key() != a.sampling_params.warper_key()


@pytest.mark.parametrize("body, field", [
    ({"input_ids": [[1], [2]], "stream": True}, "stream"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}}, "sampling_params.max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"temprature": 0.5}}, "sampling_params.temprature"),
    ({"input_ids": [1], "sampling_params": {"n": 4}}, "sampling_params.n"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params"),
    ({"input_ids": [1], "image_data": [{"path": "x.png"}]}, "image_data[0].path"),
    ({"input_ids": [1], "video_data": ["https://example.com/v.mp4"]}, "video_data[0].url"),
    ({"input_ids": [[1], [2]], "image_data": ["a.png"]}, "image_data"),
    ({"input_ids": [1], "lora_path": "adapter"}, "lora_path"),
    ({"input_ids": [1], "logprob_start_len": 0}, "logprob_start_len"),
    ({"input_ids": [1, "2"]}, "input_ids"),
    ({"input_ids": [1], "text": "a"}, "text / input_ids"),
    ({"input_ids": [1], "sampling_param": {}}, "sampling_param"),
])
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(ValueError) as info:
        parse_request(GenerateReqInput, body)
    assert field in str(info.value)
    if body.get("stream"):
        assert "stream=True takes one request, not a batch of 2" in str(info.value)


def test_response_parses_as_sglang_sends_it():
    resp = GenerateResponse.model_validate(SGLANG_RESPONSE)
    assert resp.meta_info.finish_reason.type == "stop" and resp.meta_info.finish_reason.matched == 151645
    assert resp.meta_info.output_token_logprobs[0] == (-0.12, 12366, None)
    out = GenerateOutput.from_json(json.loads(json.dumps(SGLANG_RESPONSE)))
    assert out.output_ids == [12366, 13, 151645] and out.output_logprobs == [-0.12, -0.01, -0.5]
    assert (out.finish_type, out.weight_version, out.prompt_tokens) == ("stop", "default", 12)
    # round trip keeps SGLang's finish reason shapes
    again = resp.to_json()
    assert again["meta_info"]["finish_reason"] == {"type": "stop", "matched": 151645}
    assert again["meta_info"]["total_retractions"] == 0


def test_weight_and_admin_requests():
    disk = parse_request(UpdateWeightFromDiskReqInput, {"model_path": "/ckpt/step_10", "load_format": None,
                                                         "abort_all_requests": False, "weight_version": "10",
                                                         "flush_cache": True, "token_step": 10})
    assert disk.model_path == "/ckpt/step_10" and disk.weight_version == "10"
    tensor = parse_request(UpdateWeightsFromTensorReqInput, {"serialized_named_tensors": ["AAAA"], "load_format": None,
                                                             "flush_cache": False, "weight_version": "3",
                                                             "abort_all_requests": True})
    assert tensor.serialized_named_tensors == ["AAAA"] and tensor.abort_all_requests
    group = parse_request(InitWeightsUpdateGroupReqInput, {"master_address": "127.0.0.1", "master_port": 29500,
                                                           "rank_offset": 1, "world_size": 2})
    assert (group.group_name, group.backend) == ("weight_update_group", "nccl")  # SGLang's defaults
    dist = parse_request(UpdateWeightsFromDistributedReqInput, {"names": ["a", "b"], "dtypes": ["bfloat16", "float32"],
                                                                "shapes": [[2, 3], [4]], "group_name": "g",
                                                                "flush_cache": True, "weight_version": "v"})
    assert dist.shapes == [[2, 3], [4]]
    assert parse_request(PauseGenerationReqInput, None).mode == "abort"
    assert parse_request(UpdateWeightVersionReqInput, {"new_version": "7"}).abort_all_requests
    with pytest.raises(ValueError, match="mode"):
        parse_request(PauseGenerationReqInput, {"mode": "freeze"})
    with pytest.raises(ValueError, match="names, dtypes and shapes"):
        parse_request(UpdateWeightsFromDistributedReqInput, {"names": ["a"], "dtypes": [], "shapes": [[1]]})
    with pytest.raises(ValueError, match="rank_offset"):
        parse_request(InitWeightsUpdateGroupReqInput, {"master_address": "x", "master_port": 1, "rank_offset": 0, "world_size": 2})


def test_tensor_codec_is_safetensors_never_pickle():
    tied = torch.randn(4, 3)
    named = {"a.weight": tied, "b.weight": tied, "c": torch.arange(5, dtype=torch.int64), "d": torch.ones(2, dtype=torch.bfloat16)}
    back = deserialize_named_tensors(serialize_named_tensors(named))
    assert set(back) == set(named) and all(torch.equal(back[k], named[k]) and back[k].dtype == named[k].dtype for k in named)
    with pytest.raises(ValueError, match="never unpickled"):
        deserialize_named_tensors(base64.b64encode(pickle.dumps({"a": 1})).decode())
    with pytest.raises(ValueError, match="base64"):
        deserialize_named_tensors("not base64!")


def test_media_data_from_a_conversation():
    obs, _ = relax_gym.make("echo-ink").reset(seed=0)
    data = media_data(obs)
    assert set(data) == {"image_data", "audio_data"}
    (image,), (audio,) = data["image_data"], data["audio_data"]
    assert image["url"].startswith("file://") and image["sampling"] == {"max_pixels": 50176}
    assert audio["url"].endswith(".wav") and audio["sampling"]["sample_rate"] == 16000
    req = parse_request(GenerateReqInput, {"input_ids": [1], **data})
    assert req.split()[0].media["audio"][0].sampling == audio["sampling"]
