"""benchmarks/ppo_vs_grpo.py's helpers: the budget overrides, the same-recipe check, the eval curves, the chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("ppo_vs_grpo")


def test_budget_is_steps_seconds_or_both(bench):
    assert bench.budget_overrides(50, None) == ["trainer.steps=50", "trainer.time_budget_s=null"]
    assert bench.budget_overrides(None, 600.0) == ["trainer.time_budget_s=600.0"]
    assert bench.budget_overrides(5, 60.0) == ["trainer.steps=5", "trainer.time_budget_s=60.0"]
    with pytest.raises(ValueError, match="give a budget"):
        bench.budget_overrides(None, None)


def test_the_two_recipes_differ_only_in_the_algorithm(bench, tmp_path):
    recipes = {k: str(REPO / v) for k, v in bench.RECIPES.items()}
    bench.check_same_recipe(recipes, ["model.base=null"])  # the shipped pair passes
    with pytest.raises(ValueError, match="trains algorithm.name='grpo', not 'ppo'"):
        bench.check_same_recipe({"grpo": recipes["grpo"], "ppo": recipes["grpo"]}, [])
    changed = tmp_path / "grpo.yaml"  # the GRPO recipe with one trainer knob changed
    changed.write_text(Path(recipes["grpo"]).read_text().replace("group_size: 4", "group_size: 6"))
    with pytest.raises(ValueError, match=r"differs from the others outside \('algorithm', 'critic'\): \['trainer'\]"):
        bench.check_same_recipe({"grpo": str(changed), "ppo": recipes["ppo"]}, [])


def test_eval_curves_and_the_chart(bench, tmp_path):
    runs = {}
    for name, rewards in (("grpo", [0.1, 0.3, 0.4]), ("ppo", [0.1, 0.2, 0.5])):
        run_dir = tmp_path / name
        run_dir.mkdir()
        rows = [{"step": 0, "eval_reward": rewards[0]}, {"step": 1, "elapsed_s": 60.0, "time_step_s": 2.0},
                {"step": 2, "elapsed_s": 120.0, "time_step_s": 4.0, "eval_reward": rewards[1]},
                {"step": 3, "elapsed_s": 180.0, "time_step_s": 3.0, "eval_reward": rewards[2]}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs[name] = [{"seed": 0, "run_dir": str(run_dir)}]
    assert bench.eval_curve(tmp_path / "ppo", "time") == ([0.0, 2.0, 3.0], [0.1, 0.2, 0.5])
    assert bench.eval_curve(tmp_path / "ppo", "step") == ([0.0, 2.0, 3.0], [0.1, 0.2, 0.5])
    assert bench.seconds_per_step(tmp_path / "grpo") == pytest.approx(3.0)
    out = bench.plot(runs, tmp_path / "chart.png", "time", "test")
    assert out.stat().st_size > 1000
