"""The async engine end to end on real Ray Serve: 3 steps of a tiny policy at S = 1 with carried stragglers on the
TransferQueue bus (the real-Serve smoke run of the async mode's full path).

The other settings run for real elsewhere: S = 0 on the in-process bus with stragglers=wait in
tests/integration/test_modes_agree.py (which also checks that wait files episodes by their place in the step), S = 0
with wait on TransferQueue in tests/integration/test_recovery.py, and the staleness bound of every consumed sample
for S = 0, 1, 2 (wait and carry) on the virtual clock in tests/trainer/plan/test_schedule.py.

Each run goes through ``relax-gym train ... trainer.mode=async`` (the CLI reuses the test session's Ray). Checked:
the run reaches its last step; every sample id produced by the env workers is consumed by the actor exactly once;
staleness never exceeds S; policy versions increase by one per step; the colocate layout (metrics rows, eval,
checkpoint, summary) is there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="a real Ray Serve training run on the TransferQueue bus"),
              pytest.mark.timeout(600)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
P, G, STEPS = 2, 2, 3
TINY = ["model.base=null", f"trainer.steps={STEPS}", "trainer.sft_warmup_steps=1", "trainer.sft_batch_size=2", f"trainer.prompts_per_step={P}",
        f"trainer.group_size={G}", "trainer.eval_episodes=2", "trainer.eval_every=2", "trainer.checkpoint_every=3",
        "inference.max_new_tokens=8", "metrics.tensorboard=false", "trainer.mode=async"]


@pytest.mark.parametrize("staleness, bus, stragglers", [(1, "transferqueue", "carry")])
def test_async_run_consumes_every_sample_once_within_the_staleness_bound(ray_session, tmp_path, staleness, bus, stragglers):
    run_dir = tmp_path / "run"
    args = ["train", str(RECIPE), *TINY, f"trainer.max_staleness={staleness}", f"roles.bus={bus}",
            f"trainer.stragglers={stragglers}", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["mode"] == "async" and summary["max_staleness"] == staleness
    assert summary["samples_produced"] == summary["samples_consumed"] == STEPS * P * G
    assert summary["samples_duplicated"] == 0 and summary["samples_unconsumed"] == 0
    assert summary["samples_lost"] == 0 and summary["stragglers"] == stragglers

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["samples_consumed"] == P * G and r["partial_groups"] == 0 for r in steps)
    assert all(0 <= r["staleness_max"] <= staleness for r in steps)
    assert all(r["trained_version"] - r["rollout_version_min"] <= staleness for r in steps)
    versions = [r["policy_version"] for r in steps]
    assert versions == list(range(versions[0], versions[0] + STEPS)) and versions[0] == 2  # warm-up push, then +1
    assert all(r["trained_version"] == r["policy_version"] - 1 for r in steps)
    mins = [r["rollout_version_min"] for r in steps]
    assert mins[0] >= 1 and (stragglers == "carry" or mins == sorted(mins))  # carried groups land out of launch order
    assert all(0.0 <= r["data_wait_fraction"] <= 1.0 and "time_step_s" in r for r in steps)
    # media stored once per group (trainer.dedupe_media): the G rows of a group share one copy of their clip
    assert all(r["bus_media_bytes_saved"] > 0.5 * r["bus_bytes_put"] for r in steps)
    assert "eval_reward" in rows[-1] and any("eval_reward" in r for r in steps if r["step"] == 2)
    assert [r for r in rows if r["step"] < 0], "the SFT warm-up logs its steps"
    # rollout records (relax-gym view): the env workers write the eval and train episodes they play, media included
    records = {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in (run_dir / "rollouts").glob("step_*.jsonl")}
    assert [r["kind"] for r in records["step_000000.jsonl"]] == ["eval", "eval"]
    for step in range(1, STEPS + 1):
        train = [r["index"] for r in records[f"step_{step:06d}.jsonl"] if r["kind"] == "train"]
        if stragglers == "wait":  # by place in the step
            assert sorted(train) == list(range(P * G))
        else:  # carried groups are filed where they landed, indexed by launch number (unique)
            assert len(train) == len(set(train)) >= G
    videos = [p for r in records["step_000001.jsonl"] for m in r["messages"] for p in m["parts"] if p["type"] == "video"]
    assert videos and all((run_dir / v["url"]).is_file() for v in videos)
    ckpt = run_dir / "checkpoints" / "step_000003"
    assert (ckpt / "trainer_state.pt").is_file() and any(ckpt.glob("*.safetensors"))
