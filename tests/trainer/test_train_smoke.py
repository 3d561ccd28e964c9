"""A 3-step run of every recipe through the real loop: SFT warm-up, rollouts over HTTP against the embedded
engine, RL steps, weight pushes, eval, metrics, checkpoint, plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import relax_gym
from typer.testing import CliRunner

from relax_gym.cli import app

# gpu-* recipes launch SGLang and need a checkpoint and GPUs: tests/trainer/test_gpu_recipe.py loads them instead.
# cpu-openai-agent runs its agent program in sandboxes for every episode: tests/integration/test_openai_agent_training.py
# trains it for 3 steps in each mode and on both sandbox backends, with more checks than this smoke run.
# cpu-nextqa-describe needs its judge model (built in minutes): tests/integration/test_judge_training.py trains it for 3
# steps in each mode with a small judge built in the test.
# cpu-gem-guess pays GEM's rewards (-0.1 for a reply without a guess: below this test's [0, 1] eval bound) from GEM's
# venv: tests/envs/interop/test_gem_env.py trains it for 3 steps.
ELSEWHERE = {"cpu-openai-agent.yaml", "cpu-nextqa-describe.yaml", "cpu-gem-guess.yaml"}
RECIPES = sorted(p for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml")
                 if not p.name.startswith("gpu-") and p.name not in ELSEWHERE)
SMALL = ["model.base=null", "trainer.steps=3", "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=4", "trainer.prompts_per_step=2",
         "trainer.group_size=2", "trainer.eval_episodes=3", "trainer.eval_every=2", "trainer.checkpoint_every=3",
         "metrics.tensorboard=true"]


def test_every_recipe_is_covered():
    assert {p.name for p in RECIPES} >= {"cpu-nextqa.yaml", "cpu-echo-ink.yaml", "cpu-tool-use.yaml"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_smoke_run(recipe, tmp_path):
    if "tool-use" in recipe.name:
        from relax_gym.sandbox import SandboxUnavailable, select_backend

        try:
            select_backend()
        except SandboxUnavailable as exc:
            pytest.skip(str(exc))
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(recipe), *SMALL, "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["status_ok"] + r.get("status_truncated", 0) + r.get("status_invalid_action", 0) == 4 for r in steps)
    assert rows[-1]["policy_version"] == 1 + 3  # warm-up push + one per step
    assert "eval_reward" in rows[-1] and "eval_reward" in [r for r in rows if r["step"] == 2][0]
    assert [r for r in rows if r["step"] < 0], "the SFT warm-up logs its steps"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and 0.0 <= summary["eval_reward_end"] <= 1.0
    ckpt = run_dir / "checkpoints" / "step_000003"
    assert (ckpt / "trainer_state.pt").is_file() and any(ckpt.glob("*.safetensors"))
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["trainer"]["steps"] == 3
    assert config["env"]["id"] == relax_gym.spec(config["env"]["id"]).versioned_id, "the run names the exact version"
    assert config["env"]["id"].endswith("-v1") and summary["env"] == config["env"]["id"]
    records = [json.loads(line) for f in sorted((run_dir / "rollouts").glob("step_*.jsonl")) for line in f.read_text().splitlines()]
    assert records and {r["env"] for r in records} == {config["env"]["id"]}, "each record names the exact env"
    plotted = CliRunner().invoke(app, ["plot", str(run_dir)])
    assert plotted.exit_code == 0 and (run_dir / "reward.png").stat().st_size > 1000
    if "tool-use" in recipe.name:  # the run's sandboxes are gone when it returns, though this process goes on
        from relax_gym.sandbox import select_backend

        assert select_backend().live() == []


def test_bad_recipe_value_is_one_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["train", str(RECIPES[0]), "trainer.stepz=3", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown key 'trainer.stepz' (did you mean 'trainer.steps'?)" in " ".join(result.output.split())


def test_plot_of_a_non_run_dir_fails_clearly(tmp_path):
    result = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 1 and "no metrics" in " ".join(result.output.split())


@pytest.mark.timeout(600)
def test_kl_to_the_warmed_up_policy_is_computed_and_logged(tmp_path):
    run_dir = tmp_path / "run"
    nextqa = next(p for p in RECIPES if p.name == "cpu-nextqa.yaml")  # GRPO: every valid episode is trained on
    args = ["train", str(nextqa), *SMALL, "algorithm.kl_coef=0.1", "metrics.tensorboard=false", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in steps if r["step"] >= 1 and r.get("episodes_trained")]
    assert trained and all("kl_ref" in r and r["kl_ref"] >= 0 for r in trained)
