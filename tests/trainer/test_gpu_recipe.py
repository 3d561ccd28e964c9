"""recipes/gpu-nextqa-sglang-megatron.yaml loads with the config, and differs from the CPU recipe where
docs/scaling.md says it does (engine, backend, checkpoint, async roles on GPUs)."""

from __future__ import annotations

from pathlib import Path

from relax_gym.trainer.config import load_recipe
from relax_gym.trainer.async_engine.controller import plan_roles
from relax_gym.trainer.dcs.service import advertised_url

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_the_gpu_recipe_loads_with_sglang_and_megatron():
    gpu = load_recipe(RECIPES / "gpu-nextqa-sglang-megatron.yaml")
    cpu = load_recipe(RECIPES / "cpu-nextqa.yaml")
    assert (gpu.inference.engine, gpu.actor.backend, gpu.trainer.mode) == ("sglang", "megatron", "async")
    assert gpu.model.path and gpu.model.dtype == "bfloat16" and gpu.inference.sglang.python
    assert gpu.inference.sglang.weight_sync == "nccl" and gpu.inference.host == "127.0.0.1"
    assert (gpu.env.id, gpu.algorithm.name, gpu.model.family) == (cpu.env.id, cpu.algorithm.name, cpu.model.family)
    specs = {s.name: s for s in plan_roles(gpu, bus=None, coordinator=None, app_prefix="t")}
    assert specs["inference"].section.num_gpus == 1 and specs["inference"].section.replicas == 4
    assert specs["actor"].section.num_gpus == 1 and specs["env_worker"].section.num_gpus == 0


def test_overrides_switch_the_gpu_recipe_to_another_checkpoint_and_interpreter():
    cfg = load_recipe(RECIPES / "gpu-nextqa-sglang-megatron.yaml",
                      ["model.path=/ckpt/omni", "inference.sglang.python=/envs/sg/bin/python", "inference.sglang.tp_size=2"])
    assert (cfg.model.path, cfg.inference.sglang.python, cfg.inference.sglang.tp_size) == ("/ckpt/omni", "/envs/sg/bin/python", 2)


def test_engines_bound_to_every_interface_register_under_their_node_ip(monkeypatch):
    import ray

    node = "10.1.2.3"  # not-a-connection-target: a fake node address the URL is built from
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: node)
    assert advertised_url("http://0.0.0.0:30000") == f"http://{node}:30000"
    assert advertised_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000"
