"""Weight updates that change what the engine generates: from tensors, from disk and by torch.distributed
broadcast (gloo, the trainer as rank 0 in another process); refused updates load nothing."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import save_file

from relax_gym.trainer.engines.client import EngineHTTPError
from relax_gym.trainer.policy.model import PolicyConfig, build_policy, save_policy

from . import _dist_trainer
from .conftest import start, stop

PROMPTS = ["Describe the picture.", "What is two plus two?", "Say something nice"]


@pytest.fixture(scope="module")
def served(policy):
    s = start(*policy)
    yield s
    stop(s)


@pytest.fixture(scope="module")
def other_models():
    return {seed: build_policy(PolicyConfig(seed=seed))[0] for seed in (1, 2, 3)}


def _greedy(served, n: int = 12) -> list[list[int]]:
    ids = [served.processor.encode_text(t) for t in PROMPTS]
    outs = served.client.generate_batch(ids, sampling_params={"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True})
    return [o.output_ids for o in outs], [o.weight_version for o in outs]


def _reference(model, processor, n: int = 12) -> list[list[int]]:
    """Plain ``model.generate`` greedy rows, each cut after its EOS (the engine, ignoring EOS, continues)."""
    out = []
    for text in PROMPTS:
        ids = torch.tensor([processor.encode_text(text)])
        with torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                 temperature=None, top_k=None, top_p=None)
        row = seq[0, ids.shape[1]:].tolist()
        out.append(row[: row.index(processor.eos_token_id) + 1] if processor.eos_token_id in row else row)
    return out


def _restore(served):
    served.client.update_weights_from_tensor(served.model.state_dict(), weight_version="0")


def test_update_from_tensor_changes_outputs(served, other_models):
    base, versions = _greedy(served)
    assert versions == ["0"] * 3
    served.client.pause_generation("retract")  # the RL loop: pause, swap, continue
    response = served.client.update_weights_from_tensor(other_models[1].state_dict(), weight_version="step-1")
    served.client.continue_generation()
    assert response["success"] and "step-1" in response["message"]
    new, versions = _greedy(served)
    assert versions == ["step-1"] * 3 and new != base
    ref = _reference(other_models[1], served.processor)  # the new weights' own greedy continuation
    assert all(a[: len(b)] == b for a, b in zip(new, ref))
    assert served.client.get_model_info()["weight_version"] == "step-1"
    _restore(served)
    assert _greedy(served)[0] == base


def test_update_from_disk_changes_outputs(served, other_models, tmp_path, policy):
    base, _ = _greedy(served)
    path = save_policy(other_models[2], policy[1], tmp_path / "step_2")  # checkpoint names, tied lm_head dropped
    response = served.client.update_weights_from_disk(str(path), weight_version="disk-2")
    assert response["success"] and response["num_paused_requests"] == 0
    new, versions = _greedy(served)
    assert versions == ["disk-2"] * 3 and new != base
    expected, _ = _greedy_of(served, other_models[2])
    assert new == expected
    with pytest.raises(EngineHTTPError) as info:
        served.client.update_weights_from_disk(str(tmp_path / "missing"))
    assert info.value.status_code == 400 and "does not exist" in info.value.message
    _restore(served)


def _greedy_of(served, model):
    """The engine's own greedy outputs on ``model``'s weights (through a tensor update), then restored."""
    served.client.update_weights_from_tensor(model.state_dict(), weight_version="tmp")
    try:
        return _greedy(served)
    finally:
        _restore(served)


def test_update_from_distributed_changes_outputs(served, other_models, tmp_path):
    base, _ = _greedy(served)
    weights = tmp_path / "seed3.safetensors"
    save_file({k: v.clone().contiguous() for k, v in other_models[3].state_dict().items()}, str(weights))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = tmp_path / "result.json"
    ctx = mp.get_context("spawn")
    trainer = ctx.Process(target=_dist_trainer.push_weights, args=(served.server.url, port, str(weights), "dist-3", str(result)))
    trainer.start()
    try:
        trainer.join(60)
    finally:
        if trainer.is_alive():
            trainer.kill()
    assert trainer.exitcode == 0, f"the trainer process failed (exit code {trainer.exitcode})"
    answers = json.loads(result.read_text())
    assert answers["update"]["success"] and answers["destroy"]["success"]
    new, versions = _greedy(served)
    assert versions == ["dist-3"] * 3 and new != base
    expected, _ = _greedy_of(served, other_models[3])
    assert new == expected
    _restore(served)


def test_refused_updates_load_nothing(served, other_models):
    base, _ = _greedy(served)
    state = dict(other_models[1].state_dict())
    state["model.no_such.weight"] = torch.zeros(3)
    with pytest.raises(EngineHTTPError) as info:
        served.client.update_weights_from_tensor(state, weight_version="bad")
    assert info.value.status_code == 400 and "unknown tensor name" in info.value.message and "model.no_such.weight" in info.value.message
    wrong = {"lm_head.weight": torch.zeros(3, 3)}
    with pytest.raises(EngineHTTPError) as info:
        served.client.update_weights_from_tensor(wrong)
    assert "shape mismatch" in info.value.message
    with pytest.raises(EngineHTTPError) as info:
        served.client.update_weights_from_distributed(["lm_head.weight"], ["float32"], [[1]], group_name="nope")
    assert info.value.status_code == 400 and "no weight update group" in info.value.message
    with pytest.raises(EngineHTTPError) as info:
        served.client.init_weights_update_group("127.0.0.1", 1, 1, 2, backend="nccl")
    assert "gloo" in info.value.message
    assert _greedy(served) == (base, ["0"] * 3)
    assert served.client.update_weight_version("v9")["new_version"] == "v9"
    assert _greedy(served)[1] == ["v9"] * 3
    served.client.update_weight_version("0")
