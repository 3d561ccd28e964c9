"""A new env's reward components are logged under their own names, with no trainer change: an env registered here
reports ``{"correct": .., "brevity": ..}`` and a short colocate run logs ``correct_mean`` / ``brevity_mean`` per step,
``eval_correct`` / ``eval_brevity`` per eval and ``eval_correct_start`` / ``_end`` in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.omni import Message
from relax_gym.omni.parts import TextPart

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
ENV_ID = "test-breakdown-probe"


class BreakdownProbe(AgentEnv):
    """One text turn: ``correct`` when the answer says A, ``brevity`` the shorter it is."""

    media_kinds = ()

    def _reset(self, options):
        return Opening([Message(role="user", content=(TextPart("Answer with A or B inside <answer></answer>."),))],
                       gold="<answer>A</answer>")

    def _step(self, action):
        correct = 1.0 if "A" in action else 0.0
        brevity = 1.0 / (1.0 + len(action) / 20.0)
        return Outcome([], 0.5 * correct + 0.5 * brevity, True, {"correct": correct, "brevity": brevity})


@pytest.mark.timeout(600)
def test_a_new_envs_reward_components_are_logged_by_name(tmp_path, clean_registry):
    relax_gym.register(ENV_ID, BreakdownProbe, override=True)
    run_dir = tmp_path / "run"
    args = ["train", str(RECIPE), "model.base=null", f"env.id={ENV_ID}", "env.kwargs={}", "env.eval_kwargs={}", "trainer.steps=2",
            "trainer.sft_warmup_steps=0", "trainer.prompts_per_step=2", "trainer.group_size=2", "trainer.eval_episodes=2",
            "trainer.eval_every=1", "trainer.checkpoint_every=2", "trainer.time_budget_s=null", "inference.max_new_tokens=8",
            "metrics.tensorboard=false", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "correct" in result.output  # the CLI's eval line names the components it has
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 <= r["correct_mean"] <= 1.0 and 0.0 < r["brevity_mean"] <= 1.0
        assert {"eval_correct", "eval_brevity", "eval_reward"} <= set(r)
        assert not {"accuracy_mean", "format_mean", "eval_accuracy", "eval_format"} & set(r)
    assert {"eval_correct", "eval_brevity"} <= set(next(r for r in rows if r["step"] == 0))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"eval_reward_start", "eval_correct_start", "eval_brevity_start", "eval_correct_end", "eval_brevity_end"} <= set(summary)
