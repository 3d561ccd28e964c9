"""Three training steps of a tiny policy on a foreign env, as the interop tests (and the async one in
tests/integration) run them."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from relax_gym.cli import app

# three colocate steps of a tiny policy; the env's id and kwargs replace ENV
RECIPE = """
model: {base: null, hidden_size: 64, intermediate_size: 128, num_layers: 1}
env: ENV
inference: {max_new_tokens: 8}
trainer: {steps: 3, sft_warmup_steps: 1, sft_batch_size: 2, prompts_per_step: 2, group_size: 2, eval_episodes: 2,
          eval_every: 3, checkpoint_every: 3, concurrency: 4}
metrics: {tensorboard: false}
"""


def train_three_steps(tmp_path: Path, env: dict, *extra: str) -> list[dict]:
    """``relax-gym train`` of :data:`RECIPE` on ``env`` (``{"id": ..., "kwargs": {...}}``); the step rows."""
    (tmp_path / "recipe.yaml").write_text(RECIPE.replace("ENV", json.dumps({"kwargs": {}, "eval_kwargs": {}, **env})))
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "recipe.yaml"), "--run-dir", str(run_dir), *extra])
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r.get("episodes_masked", 0) == 0 and r.get("status_env_error", 0) == 0 for r in steps), steps
    return steps
