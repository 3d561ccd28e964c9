"""actor.backend=megatron in the config (parallel sizes, family) and megatron-core's process state: one clear error
for what a CPU or a single process cannot run; set up by the first actor, torn down by the last close."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from megatron.core import parallel_state

from relax_gym.trainer.config import ConfigError, load_recipe
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.actors.megatron import runtime as megatron_runtime
from relax_gym.trainer.actors.megatron.actor import MegatronActor
from relax_gym.trainer.actors.megatron.runtime import ParallelSizes


def error_of(*overrides: str) -> str:
    with pytest.raises((ConfigError, ValueError)) as info:
        load_recipe(None, list(overrides))
    return " ".join(str(info.value).split())


def test_megatron_backend_parallel_sizes_multiply_to_the_world_size():
    cfg = load_recipe(None, ["actor.backend=megatron", "actor.parallel.tp=2", "actor.parallel.pp=2", "actor.parallel.dp=2"])
    assert cfg.actor.backend == "megatron" and cfg.actor.parallel.world == 8
    assert ParallelSizes.of(cfg.actor.parallel) == ParallelSizes(tensor=2, pipeline=2, data=2)


def test_context_parallel_is_refused_with_the_reason():
    message = error_of("actor.backend=megatron", "actor.parallel.cp=2")
    assert "actor.parallel.cp=2: context parallel is not supported" in message and "ring attention" in message


def test_expert_parallel_rides_on_the_data_parallel_ranks():
    assert "actor.parallel.ep=2 must divide actor.parallel.dp=1" in error_of("actor.backend=megatron", "actor.parallel.ep=2")
    cfg = load_recipe(None, ["actor.backend=megatron", "model.family=qwen3_omni_moe", "actor.parallel.dp=2",
                             "actor.parallel.ep=2"])
    assert cfg.actor.parallel.world == 2


def test_parallel_sizes_belong_to_the_megatron_backend():
    assert "applies to actor.backend=megatron, not 'hf'" in error_of("actor.parallel.pp=2")


def test_the_moe_family_converts_to_megatron_with_routing_replay():
    cfg = load_recipe(None, ["actor.backend=megatron", "model.family=qwen3_omni_moe", "algorithm.routing_replay=true"])
    assert cfg.actor.backend == "megatron" and cfg.model.family == "qwen3_omni_moe" and cfg.algorithm.routing_replay


def test_a_single_process_cannot_hold_a_tensor_parallel_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"needs 2 processes: a rank group"):
        megatron_runtime.acquire(ParallelSizes(tensor=2))
    assert not dist.is_initialized() and megatron_runtime.active_users() == 0


def test_the_one_process_actor_refuses_a_layout_of_several_ranks_before_anything_is_set_up():
    with pytest.raises(ValueError, match=r"has 2 ranks: use RankActor on each rank"):
        MegatronActor(*build_policy(), lr=1e-3, parallel=ParallelSizes(data=2, expert=2))
    assert not dist.is_initialized() and megatron_runtime.active_users() == 0


def test_the_first_actor_sets_megatron_core_up_and_the_last_close_tears_it_down():
    assert not dist.is_initialized() and megatron_runtime.active_users() == 0
    first = MegatronActor(*build_policy(), lr=1e-3)
    second = MegatronActor(*build_policy(), lr=1e-3)
    try:
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert parallel_state.get_tensor_model_parallel_world_size() == 1
        assert megatron_runtime.active_users() == 2
        first.close()
        first.close()  # idempotent: still one user
        assert megatron_runtime.active_users() == 1 and dist.is_initialized()
    finally:
        second.close()
    assert megatron_runtime.active_users() == 0
    assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()


def test_a_model_of_another_family_is_refused_before_anything_is_set_up():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="converts Qwen2.5-Omni thinkers"):
        MegatronActor(model, None, lr=1e-3)
    assert not dist.is_initialized() and megatron_runtime.active_users() == 0


def test_a_failed_set_up_tears_down_the_process_group_it_made(monkeypatch):
    """The default group is made, then the model-parallel groups fail: the group is not left behind."""
    def fail(**kwargs):
        raise RuntimeError("no model-parallel groups today")

    monkeypatch.setattr(parallel_state, "initialize_model_parallel", fail)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="no model-parallel groups today"):
        megatron_runtime.acquire()
    assert not dist.is_initialized() and megatron_runtime.active_users() == 0
