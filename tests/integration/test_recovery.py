"""Recovery of the async engine on real Ray Serve, with faults injected through the ``faults:`` config: the real-kill
smoke run of the suite for every role but the critic (tests/integration/test_async_ppo.py kills a critic under
carried stragglers at S = 1). The orderings a real run reaches only by chance (a replica dying mid-group or
mid-stream, a role replaced past its budget, carry discards) are replayed exactly on the virtual clock in
tests/trainer/plan/test_controller_replay.py; what only a real run shows is here:

- Level 1: real Ray Serve replicas of the env worker, the inference role and the ``genrm`` role (the judge model of
  ``nextqa-describe``) are killed (steps 1, 2 and 3) and replaced, losing and duplicating nothing, on the
  TransferQueue bus; every episode is judged once, and no kill masks an episode or fails a judge call.
- Level 2: rank 1 of the tensor-parallel-2 Megatron actor is killed when step 4 starts (checkpoints every 2 steps).
  The rank group fails as a whole and the controller restarts the topology from the step-2 checkpoint (written by
  both ranks with dist_checkpointing, read back by a new group): steps 3 and 4 are trained again from the same data
  cursor, every metrics row appears once, versions continue as in an uninterrupted run.
- The bus and the records on a video env: media go on the bus once per group, the env workers write the rollout
  records (the eval and train episodes they play, their clips beside them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from relax_gym.cli import app

from .judging import judged_every_episode

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="a real Ray Serve training run with killed replicas and a global restart"),
              pytest.mark.timeout(600)]

# nextqa-describe: its match part only a judge scores
JUDGED_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa-describe.yaml"
P, G = 2, 2
TINY = ["model.base=null", "trainer.sft_warmup_steps=1", "trainer.sft_batch_size=2", f"trainer.prompts_per_step={P}", f"trainer.group_size={G}",
        "trainer.eval_episodes=2", "inference.max_new_tokens=8", "metrics.tensorboard=false", "trainer.mode=async",
        "trainer.time_budget_s=null", "roles.health_check_period_s=2"]


def train(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)


def all_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_rows(run_dir: Path) -> list[dict]:
    return [r for r in all_rows(run_dir) if r["step"] >= 1]


def test_killed_replicas_and_a_dead_actor_rank_lose_nothing(ray_session, judge_dir, tmp_path):
    steps, run_dir = 4, tmp_path / "run"
    kills = ("[{kind: kill, role: env_worker, at_step: 1}, {kind: kill, role: inference, at_step: 2}, "
             "{kind: kill, role: genrm, at_step: 3}, {kind: kill, role: actor, rank: 1, at_step: 4}]")
    train([str(JUDGED_RECIPE), *TINY, f"trainer.steps={steps}", "trainer.eval_every=2", "trainer.checkpoint_every=2",
           f"judge.model={judge_dir}", "algorithm.kl_coef=0.05", "roles.bus=transferqueue", "actor.backend=megatron",
           "actor.parallel.tp=2", f"faults.inject={kills}", "--run-dir", str(run_dir)])

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps
    assert summary["faults_injected"] == {"kill": 4, "kill:env_worker": 1, "kill:inference": 1, "kill:genrm": 1,
                                          "kill:actor": 1}
    # each killed replica replaced once
    assert summary["restarts_level1"] == {"env_worker": 1, "inference": 1, "genrm": 1}
    assert summary["restarts_level2"] == 1 and summary["restarted_from_steps"] == [2]  # steps 3, 4 trained again
    assert summary["samples_consumed"] == summary["samples_produced"] == steps * P * G
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    assert summary["samples_regenerated"] >= P * G  # step 3's rollout (at least) was thrown away and made again
    fired = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [(f["step"], f["spec"]["role"]) for f in fired] == [(1, "env_worker"), (2, "inference"), (3, "genrm"),
                                                               (4, "actor")]

    rows = step_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # the rows of the lost attempt were rewound, none twice
    assert all(r["samples_consumed"] == P * G and r["partial_groups"] == 0 for r in rows)
    # no kill reached the data: the workers' calls (the judge's included) waited for the new replica
    assert not any(r.get("status_env_error") or r.get("status_engine_error") for r in rows), "a kill reached the data"
    assert not any(r.get("judge_failed_engine_error") or r.get("judge_failed_timeout") for r in rows)
    judged_every_episode(rows, P * G)  # every episode judged by the genrm role, once
    assert [r["policy_version"] for r in rows] == [2, 3, 4, 5]  # as an uninterrupted run: version 3 came back
    assert all(r["staleness_max"] == 0 and "kl_ref" in r for r in rows)  # on-policy: the kill lands after step 2's checkpoint
    assert all(0.0 <= r["data_wait_fraction"] <= 1.0 and "time_step_s" in r for r in rows)
    # media stored once per group (trainer.dedupe_media): the G rows of a group share one copy of their clip
    assert all(r["bus_media_bytes_saved"] > 0.5 * r["bus_bytes_put"] for r in rows)
    assert [r["step"] for r in all_rows(run_dir) if r["step"] < 0] == [-1], "the SFT warm-up logs its step"
    # rollout records (relax-gym view): the env workers write the eval and train episodes they play, media included;
    # at S = 0 each step's train episodes are filed by their place in the step
    records = {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in (run_dir / "rollouts").glob("step_*.jsonl")}
    assert [r["kind"] for r in records["step_000000.jsonl"]] == ["eval", "eval"]
    for step in (1, 2):
        assert sorted(r["index"] for r in records[f"step_{step:06d}.jsonl"] if r["kind"] == "train") == list(range(P * G))
    videos = [p for r in records["step_000001.jsonl"] for m in r["messages"] for p in m["parts"] if p["type"] == "video"]
    assert videos and all((run_dir / v["url"]).is_file() for v in videos)
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "megatron_optimizer" / "metadata.json").is_file()
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert state["step"] == 2 and state["version"] == 3
    assert state["cursor"] == {"step": 2, "seed": 0, "prompts_per_step": P, "group_size": G, "next_seed_base": 3_000}
    assert sorted(state["extra"]["consumed"]) == sorted(f"s{s:06d}-g{g:04d}-{m:02d}" for s in (1, 2)
                                                        for g in range(P) for m in range(G))
