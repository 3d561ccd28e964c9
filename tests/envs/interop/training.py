"""Three training steps of a small policy on a foreign env, as the interop tests (and the async one in
tests/integration) run them: a recipe of the repository (``recipes/cpu-gem-guess.yaml``) made small by
:data:`SMALL`, or a recipe written for the test (:func:`write_recipe`)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from relax_gym.cli import app

REPO = Path(__file__).resolve().parents[3]
GEM_RECIPE = REPO / "recipes" / "cpu-gem-guess.yaml"
SMALL = ["model.hidden_size=64", "model.num_layers=1", "inference.max_new_tokens=8", "trainer.steps=3",
         "trainer.sft_warmup_steps=1", "trainer.sft_batch_size=2", "trainer.prompts_per_step=2", "trainer.group_size=2",
         "trainer.eval_episodes=2", "trainer.eval_every=3", "trainer.checkpoint_every=3", "trainer.time_budget_s=null",
         "metrics.tensorboard=false"]


def write_recipe(folder: Path, env: dict) -> Path:
    """A recipe of a tiny random-init policy on ``env`` (``{"id": ..., "kwargs": {...}}``), to be made small by SMALL."""
    env = {"kwargs": {}, "eval_kwargs": {}, **env}
    path = folder / "recipe.yaml"
    path.write_text(f"model: {{base: null}}\nenv: {json.dumps(env)}\n")
    return path


def train_three_steps(tmp_path: Path, recipe: Path, *overrides: str) -> list[dict]:
    """``relax-gym train RECIPE SMALL... OVERRIDES...``: its three step rows, none with a masked episode."""
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(recipe), *SMALL, *overrides, "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r.get("episodes_masked", 0) == 0 and r.get("status_env_error", 0) == 0 for r in steps), steps
    assert [r for r in rows if r["step"] < 0], "the warm-up (the gold actions' format) ran"
    return steps
