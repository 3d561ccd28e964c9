"""recipes/cpu-nextqa-agent.yaml: its format warm-up can demonstrate the tool env, and a 3-step run goes through the
real loop (SFT warm-up, multi-turn rollouts over HTTP against the embedded engine, RL steps, weight pushes, eval)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.trainer.run.warmup import demonstration
from relax_gym.trainer.policy import PolicyConfig, build_policy

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-agent.yaml"
SMOKE = ["model.base=null", "trainer.steps=3", "trainer.sft_warmup_steps=2", "trainer.eval_episodes=4", "trainer.prompts_per_step=2",
         "trainer.group_size=2"]


def test_warm_up_demonstrations_call_the_tool_and_keep_its_video():
    cfg = yaml.safe_load(RECIPE.read_text())
    _, processor = build_policy(PolicyConfig(**{k: v for k, v in cfg["model"].items() if k != "base"}))  # same tokenizer
    env = relax_gym.make(cfg["env"]["id"], **cfg["env"]["kwargs"])
    rendered = demonstration(env, processor, seed=3, rng=np.random.default_rng(0))
    taught = processor.decode([i for i, m in zip(rendered.input_ids, rendered.loss_mask) if m])
    assert taught.startswith('<think></think><tool_call>{"name": "watch"') and taught.count("<|im_end|>") == 2
    assert rendered.num_media["video"] == 1 and rendered.num_media["image"] == 4
    call_tokens = len(processor.encode_text(taught.split("<|im_end|>")[0])) + 1
    assert call_tokens <= cfg["inference"]["max_new_tokens"], "the recipe's max_new_tokens cannot hold the tool call"


@pytest.mark.timeout(600)
def test_three_step_smoke_run(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(RECIPE), *SMOKE, "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r.get("episodes_masked", 0) == 0 for r in steps), "an env, engine or render failure masked episodes"
    assert all(r["status_ok"] + r.get("status_truncated", 0) + r.get("status_invalid_action", 0) == 4 for r in steps)
    assert [r["step"] for r in rows if r["step"] < 0] == [-2, -1], "the SFT warm-up logs its steps"
    assert rows[-1]["policy_version"] == 1 + 3 and "eval_reward" in rows[-1] and "eval_tool_calls" in rows[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and 0.0 <= summary["eval_reward_end"] <= 1.0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"]["id"] == "nextqa-video-agent-v1" and config["trainer"]["max_turns"] == 3  # the exact id
