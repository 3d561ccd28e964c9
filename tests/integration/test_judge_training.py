"""Training against an LLM judge in colocate mode, end to end: ``nextqa-describe`` (whose ``match`` part only a
judge can score) for 2 steps, judged by a model built in code and served by an engine in the trainer's process.
Checked: every unmasked episode was judged (one call each), the judged part is in the metrics, the judge's failures
are counted. The async mode's judge (the ``genrm`` role on real Ray Serve, its replica killed mid-run) is checked in
tests/integration/test_recovery.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app

from .judging import judged_every_episode

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="a colocate training run against a judge model"),
              pytest.mark.timeout(600)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-describe.yaml"
P, G = 2, 2
SMALL = ["model.base=null", "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=4",
         f"trainer.prompts_per_step={P}", f"trainer.group_size={G}", "trainer.eval_episodes=3", "trainer.eval_every=3",
         "trainer.checkpoint_every=3", "trainer.time_budget_s=null", "metrics.tensorboard=false"]


def train(args: list[str]) -> list[dict]:
    run_dir = Path(args[args.index("--run-dir") + 1])
    result = CliRunner().invoke(app, ["train", str(RECIPE), *SMALL, *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1]


def test_colocate_run_is_judged_in_process(judge_dir, tmp_path):
    run_dir = tmp_path / "run"
    rows = train([f"judge.model={judge_dir}", "trainer.steps=2", "trainer.eval_every=2", "trainer.sft_warmup_steps=1",
                  "--run-dir", str(run_dir)])
    assert [r["step"] for r in rows] == [1, 2]
    judged_every_episode(rows, P * G)
    assert "eval_match" in rows[-1] and "eval_reward" in rows[-1]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["judge"]["model"] == str(judge_dir)
