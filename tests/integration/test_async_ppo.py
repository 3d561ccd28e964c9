"""PPO in the async engine end to end on real Ray Serve (``relax-gym train ... trainer.mode=async algorithm.name=ppo``),
on the async mode's full path: staleness 1 with carried stragglers on the TransferQueue bus.

The env is the two-turn probe of tests/trainer/ppo_probe.py (dense reward), served from this process by an env
server on loopback, so the env workers in their Ray replicas reach it with ``env.id=remote:URL/ID``.

One run of 5 steps: the critic role is deployed, every sample is consumed once within the staleness bound, the
policy and the critic both train every step (critic metrics in each row), each checkpoint holds ``critic/`` and the
carry feeder's state (its launch cursor, where each kept sample went); a critic replica killed when step 5 starts
(its training state is gone) restarts the whole run from the last checkpoint, whose ``critic/`` the new critic
loads and whose carry state the new feeder resumes from (a restart reads a checkpoint as ``--resume`` does:
``SampleLedger.restore``): no sample id twice, none lost, every step full. The kill is at step 5 because at S = 1
step 5's rollout starts once step 3 was trained, after checkpoint 2 was written; whether checkpoint 4 was written
before it races the rollout, so the restart is from step 2 or 4. The exact orderings (a kill mid-group, carry
discards, staleness at S = 0 and 2) are replayed on the virtual clock in tests/trainer/plan/test_controller_replay.py;
``--resume`` of an async run is run by the real-width training test of tests/integration/, and a fault is not fired
again after a resume (tests/trainer/test_faults.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs.remote.server import EnvServer

from ..registry_state import restored_registry
from ..trainer.ppo_probe import ENV_ID, TwoTurnProbe

pytestmark = [pytest.mark.integration,
              pytest.mark.slow(reason="a real Ray Serve run with a critic role, carried stragglers, killed and restarted from a checkpoint"),
              pytest.mark.timeout(900)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-ppo.yaml"
P, G, S, STEPS = 2, 2, 1, 5
CRITIC_METRICS = ("value_loss", "value_clip_frac", "explained_var", "values_mean", "returns_mean", "critic_grad_norm")


@pytest.fixture(scope="module")
def probe_url():
    with restored_registry():  # the probe env is gone after this module
        relax_gym.register(ENV_ID, TwoTurnProbe, override=True)
        server = EnvServer(ENV_ID)
        server.start()
        yield f"remote:{server.url}/{ENV_ID}"
        server.close()


def tiny(env_id: str, steps: int) -> list[str]:
    return ["model.base=null", f"env.id={env_id}", "env.kwargs={}", "env.eval_kwargs={}", f"trainer.steps={steps}",
            "trainer.sft_warmup_steps=0", f"trainer.prompts_per_step={P}", f"trainer.group_size={G}",
            "trainer.eval_episodes=2", "trainer.eval_every=2", "trainer.time_budget_s=null", "inference.max_new_tokens=6",
            "metrics.tensorboard=false", "critic.micro_batch_size=2", "trainer.mode=async"]


def run(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)


def step_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1]


def test_async_ppo_with_carried_stragglers_survives_a_killed_critic(ray_session, probe_url, tmp_path):
    run_dir = tmp_path / "run"
    run([str(RECIPE), *tiny(probe_url, STEPS), f"trainer.max_staleness={S}", "trainer.stragglers=carry",
         "roles.bus=transferqueue", "trainer.checkpoint_every=2", "faults.inject=[{kind: kill, role: critic, at_step: 5}]",
         "--run-dir", str(run_dir)])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "async" and summary["max_staleness"] == S and summary["stragglers"] == "carry"
    assert summary["restarts_level2"] == 1 and summary["restarted_from_steps"] in ([2], [4])
    assert summary["faults_injected"].get("kill:critic") == 1
    assert summary["steps"] == STEPS and summary["samples_produced"] == summary["samples_consumed"] == STEPS * P * G
    assert summary["samples_duplicated"] == 0 and summary["samples_lost"] == 0 and summary["samples_unconsumed"] == 0

    steps = step_rows(run_dir)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # the steps after the restart replayed, each row once
    assert all(r["samples_consumed"] == r["samples_forwarded"] == P * G and r["partial_groups"] == 0 for r in steps)
    assert all(0 <= r["staleness_max"] <= S and r["trained_version"] - r["rollout_version_min"] <= S for r in steps)
    assert [r["policy_version"] for r in steps] == list(range(1, STEPS + 1))  # +1 a step (no warm-up), the restart included
    assert all(r["trained_version"] == r["policy_version"] - 1 for r in steps)
    assert all(0.0 <= r["data_wait_fraction"] <= 1.0 and "time_step_s" in r for r in steps)
    assert "eval_reward" in steps[1] and "eval_reward" in steps[-1]
    assert all(set(CRITIC_METRICS) <= set(r) for r in steps)
    assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 and r["grad_norm"] > 0 for r in steps)
    assert steps[0]["values_mean"] == 0.0 and steps[-1]["values_mean"] != 0.0  # the zero head, then a trained one

    for step in (2, 4):
        ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
        assert (ckpt / "critic" / "value_head.safetensors").is_file() and (ckpt / "critic" / "optimizer.pt").is_file()
        # the carry feeder's state: the launch cursor past the steps kept, where each consumed sample was placed
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        carry = state["extra"]["carry"]
        assert carry["cursor"] >= step * P and sorted(carry["placed"]) == sorted(state["extra"]["consumed"])
        assert set(carry["placed"].values()) == set(range(step))
    assert (run_dir / "checkpoints" / "step_000005" / "critic" / "value_head.safetensors").is_file()
    assert (run_dir / "critic-init" / "config.json").is_file()  # the warmed-up policy the critic started from

    # rollout records: the env workers write the eval and train episodes they play; carried groups are filed where
    # they landed, indexed by launch number, once each
    records = {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in (run_dir / "rollouts").glob("step_*.jsonl")}
    assert [r["kind"] for r in records["step_000000.jsonl"]] == ["eval", "eval"]
    for step in (1, 2):
        train_ids = [r["index"] for r in records[f"step_{step:06d}.jsonl"] if r["kind"] == "train"]
        assert len(train_ids) == len(set(train_ids)) >= G
