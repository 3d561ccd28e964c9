"""PPO in the async engine end to end on real Ray Serve (``relax-gym train ... trainer.mode=async algorithm.name=ppo``).

The env is the two-turn probe of tests/trainer/ppo_probe.py (dense reward), served from this process by an env
server on loopback, so the env workers in their Ray replicas reach it with ``env.id=remote:URL/ID``.

One run of 5 steps on TransferQueue: the critic role is deployed, every row of every step reaches the actor once,
the policy and the critic both train every step (critic metrics in each row), each checkpoint holds ``critic/``;
a critic replica killed when step 4 starts (its training state is gone) restarts the whole run from the step-2
checkpoint, whose ``critic/`` the new critic loads; the run still ends at its last step with every sample consumed.
(S = 0: step 4's rollout starts only after step 3 was trained, so after checkpoint 2 was written; the run has a fifth
step, so the kill cannot come after its end. Staleness bounds at S > 0 are checked on the virtual clock in
tests/trainer/plan/test_schedule.py and for real at S = 1 in tests/integration/test_recovery.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs.remote.server import EnvServer

from ..registry_state import restored_registry
from ..trainer.ppo_probe import ENV_ID, TwoTurnProbe

pytestmark = [pytest.mark.integration,
              pytest.mark.slow(reason="a real Ray Serve run with a critic role, killed and restarted from a checkpoint"),
              pytest.mark.timeout(900)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-ppo.yaml"
P, G = 2, 2
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


def test_async_ppo_trains_policy_and_critic_and_a_killed_critic_restarts_the_run(ray_session, probe_url, tmp_path):
    run_dir = tmp_path / "run"
    run([str(RECIPE), *tiny(probe_url, 5), "trainer.max_staleness=0", "roles.bus=transferqueue", "trainer.checkpoint_every=2",
         "faults.inject=[{kind: kill, role: critic, at_step: 4}]", "--run-dir", str(run_dir)])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts_level2"] == 1 and summary["restarted_from_steps"] == [2]
    assert summary["faults_injected"].get("kill:critic") == 1
    assert summary["steps"] == 5 and summary["samples_produced"] == summary["samples_consumed"] == 5 * P * G
    assert summary["samples_duplicated"] == 0 and summary["samples_lost"] == 0 and summary["samples_unconsumed"] == 0
    steps = step_rows(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]  # steps 3-5 replayed after the restart, each row once
    assert all(set(CRITIC_METRICS) <= set(r) for r in steps)
    assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 and r["grad_norm"] > 0 for r in steps)
    assert all(r["samples_forwarded"] == P * G and r["staleness_max"] == 0 for r in steps)
    assert steps[0]["values_mean"] == 0.0 and steps[-1]["values_mean"] != 0.0  # the zero head, then a trained one
    for step in (2, 4):
        critic = run_dir / "checkpoints" / f"step_{step:06d}" / "critic"
        assert (critic / "value_head.safetensors").is_file() and (critic / "optimizer.pt").is_file()
    assert (run_dir / "checkpoints" / "step_000005" / "critic" / "value_head.safetensors").is_file()
    assert (run_dir / "critic-init" / "config.json").is_file()  # the warmed-up policy the critic started from
