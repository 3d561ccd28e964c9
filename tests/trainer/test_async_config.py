"""The async engine's config: mode / staleness / roles, one clear error per mistake, and the planned topology."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax_gym.trainer.config import ConfigError, load_recipe
from relax_gym.trainer.async_engine.controller import plan_roles

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"


def test_async_mode_with_staleness_is_accepted():
    cfg = load_recipe(RECIPE, ["trainer.mode=async", "trainer.max_staleness=2", "roles.env_worker.replicas=2"])
    assert (cfg.trainer.mode, cfg.trainer.max_staleness, cfg.roles.env_worker.replicas) == ("async", 2, 2)
    assert cfg.roles.bus == "transferqueue" and cfg.roles.actor.replicas == 1


@pytest.mark.parametrize("overrides, message", [
    (["trainer.max_staleness=2"], "trainer.max_staleness=2 needs trainer.mode=async"),
    (["trainer.mode=async", "roles.actor.replicas=2"], "roles.actor.replicas must be 1"),
    (["trainer.mode=async", "roles.bus=redis"], "roles.bus: Input should be 'transferqueue' or 'inprocess'"),
    (["trainer.mode=async", "roles.env_worker.replica=2"], "did you mean 'roles.env_worker.replicas'"),
    (["trainer.mode=async", "trainer.max_staleness=-1"], "trainer.max_staleness: Input should be greater than or equal to 0"),
    (["trainer.stragglers=carry"], "trainer.stragglers=carry needs trainer.mode=async"),
    (["trainer.mode=async", "trainer.stragglers=drop"], "trainer.stragglers: Input should be 'wait' or 'carry'"),
])
def test_bad_async_config_is_one_clear_error(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_recipe(RECIPE, overrides)
    assert message in str(err.value)


def test_planned_topology_follows_the_config():
    cfg = load_recipe(RECIPE, ["trainer.mode=async", "trainer.max_staleness=2", "roles.env_worker.replicas=2",
                               "trainer.prompts_per_step=4", "trainer.group_size=4"])
    specs = {s.name: s for s in plan_roles(cfg, "BUS", "DCS", "run")}
    assert set(specs) == {"inference", "env_worker", "advantages", "actor"}  # no reference without a KL term
    assert specs["env_worker"].kwargs["pool_size"] == 16 * 3 // 2  # one step's episodes, S + 1 steps, 2 replicas
    assert specs["env_worker"].args[2] == "run-inference" and specs["env_worker"].section.num_cpus == 0
    assert specs["actor"].section.num_cpus == 1 and specs["inference"].kwargs["coordinator"] == "DCS"
    assert specs["env_worker"].kwargs["slots"] is None
    carry = load_recipe(RECIPE, ["trainer.mode=async", "trainer.max_staleness=2", "roles.env_worker.replicas=2",
                                 "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.stragglers=carry"])
    carried = {s.name: s for s in plan_roles(carry, "BUS", "DCS", "run", slots="SLOTS")}["env_worker"]
    assert carried.kwargs["pool_size"] == 16 // 2 and carried.kwargs["slots"] == "SLOTS"  # one step's episodes in all
    with_kl = load_recipe(RECIPE, ["trainer.mode=async", "algorithm.kl_coef=0.1"])
    assert "reference" in {s.name for s in plan_roles(with_kl, "BUS", "DCS", "run")}
