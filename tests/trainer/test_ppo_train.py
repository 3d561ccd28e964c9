"""PPO with a critic in the colocate trainer, through ``relax-gym train`` on the PPO recipe:

- 3 steps on a two-turn probe env with a dense reward: the policy and the critic both train every step (the critic's
  metrics in each row, its values move off the zero head), the step-3 checkpoint holds a ``critic/`` folder whose
  weights are not the policy's, and the policy checkpoint stays a plain causal LM (no value head);
- a run killed after its step-2 checkpoint and resumed ends at the same policy, the same critic (weights and AdamW
  state) and the same metrics rows as an uninterrupted run: the critic is saved and restored with the checkpoint.

The probe env (tests/trainer/ppo_probe.py) is text only and registered in this process (colocate mode runs every
role here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app

from .ppo_probe import ENV_ID, TwoTurnProbe

pytestmark = pytest.mark.usefixtures("clean_registry")  # the probe env is gone after each test

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-ppo.yaml"
CRITIC_METRICS = ("value_loss", "value_clip_frac", "explained_var", "values_mean", "returns_mean", "critic_grad_norm")
TIMINGS = ("elapsed_s", "rollout_tokens_per_s")


SMALL = ["model.base=null", f"env.id={ENV_ID}", "env.kwargs={}", "env.eval_kwargs={}", "trainer.sft_warmup_steps=0",
         "trainer.prompts_per_step=2", "trainer.group_size=2", "trainer.eval_episodes=2", "trainer.eval_every=2",
         "trainer.time_budget_s=null", "inference.max_new_tokens=6", "metrics.tensorboard=false", "critic.micro_batch_size=2"]


def train(*args: str) -> None:
    relax_gym.register(ENV_ID, TwoTurnProbe, override=True)
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)


def rows(run_dir: Path) -> list[dict]:
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k not in TIMINGS} for r in out]


@pytest.mark.timeout(600)
def test_colocate_ppo_trains_the_policy_and_the_critic(tmp_path):
    run_dir = tmp_path / "run"
    train(str(RECIPE), *SMALL, "trainer.steps=3", "trainer.checkpoint_every=3", "--run-dir", str(run_dir))
    steps = [r for r in rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(set(CRITIC_METRICS) <= set(r) for r in steps)
    assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 and r["grad_norm"] > 0 for r in steps)
    assert steps[0]["values_mean"] == 0.0 and steps[-1]["values_mean"] != 0.0  # the zero head, then a trained one
    assert all(r["samples_forwarded"] == 4 and r["correct_mean"] >= 0 for r in steps)
    ckpt = run_dir / "checkpoints" / "step_000003"
    policy, critic = load_file(ckpt / "model.safetensors"), load_file(ckpt / "critic" / "model.safetensors")
    assert policy.keys() == critic.keys()  # the critic's backbone: the policy's architecture, a plain causal LM
    assert any(not torch.equal(policy[k], critic[k]) for k in policy)  # trained apart from the policy
    head = load_file(ckpt / "critic" / "value_head.safetensors")
    assert head["weight"].shape == (1, 128) and head["weight"].abs().sum() > 0
    assert not any("value" in k or "head.weight" == k for k in policy)  # no value head in what the engines load
    assert not list((run_dir / "checkpoints").glob("*.partial"))  # staged parts moved in


@pytest.mark.timeout(600)
def test_a_resumed_ppo_run_restores_the_critic_exactly(tmp_path):
    """As tests/trainer/test_resume.py for GRPO: one episode at a time (trainer.concurrency=1) so both runs sample the
    same tokens; the cut run dies when step 4 starts and resumes from its step-2 checkpoint."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = [str(RECIPE), *SMALL, "trainer.steps=4", "trainer.checkpoint_every=2", "trainer.concurrency=1"]
    train(*args, "--run-dir", str(whole))
    relax_gym.register(ENV_ID, TwoTurnProbe, override=True)
    result = CliRunner().invoke(app, ["train", *args, "faults.inject=[{kind: kill, role: actor, at_step: 4}]",
                                      "--run-dir", str(cut)])
    assert result.exit_code == 1 and "--resume" in result.output
    assert (cut / "checkpoints" / "step_000002" / "critic" / "value_head.safetensors").is_file()
    train("--resume", str(cut))

    a, b = whole / "checkpoints" / "step_000004", cut / "checkpoints" / "step_000004"
    for name in ("model.safetensors", "critic/model.safetensors", "critic/value_head.safetensors"):
        wa, wb = load_file(a / name), load_file(b / name)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name
    oa, ob = torch.load(a / "critic" / "optimizer.pt"), torch.load(b / "critic" / "optimizer.pt")
    assert oa["state"].keys() == ob["state"].keys()
    assert all(torch.equal(oa["state"][i][k], ob["state"][i][k]) for i in oa["state"] for k in ("exp_avg", "exp_avg_sq"))
    assert rows(whole) == rows(cut)
    assert all(r["critic_grad_norm"] > 0 for r in rows(whole) if r["step"] > 0)
