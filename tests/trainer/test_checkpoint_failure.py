"""A checkpoint write that fails mid-run (disk full, simulated at the torch writer as a full disk reports it): the
run says so and goes on, the failed step leaves nothing behind, and ``--resume`` after a later crash picks the last
complete checkpoint (colocate mode; the async actor role returns the same error to its controller)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.trainer.run.checkpoint import STATE_FILE, latest_checkpoint

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
SMALL = ["model.base=null", "trainer.steps=4", "trainer.checkpoint_every=1", "trainer.eval_every=4", "trainer.eval_episodes=2",
         "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=2", "trainer.prompts_per_step=2", "trainer.group_size=2",
         "trainer.time_budget_s=null", "inference.max_new_tokens=8", "metrics.tensorboard=false"]


@pytest.mark.timeout(600)
def test_a_full_disk_at_one_checkpoint_is_reported_and_resume_takes_the_one_before(tmp_path, monkeypatch):
    real_save = torch.save

    def disk_full_at_step_2(obj, f, *args, **kwargs):
        if str(f).endswith(f"step_000002.partial/{STATE_FILE}"):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_2)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(RECIPE), *SMALL, "faults.inject=[{kind: kill, role: actor, at_step: 4}]",
                                      "--run-dir", str(run_dir)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "--resume" in output  # the kill at step 4, after the failed step-2 checkpoint
    assert "checkpoint of step 2 failed (training goes on)" in output and "last complete checkpoint is step_000001" in output
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001", "step_000003"]
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()][-1] == 3

    # step 3's checkpoint lost too (e.g. deleted to free space): the resume falls back to step 1
    shutil.rmtree(run_dir / "checkpoints" / "step_000003")
    assert latest_checkpoint(run_dir).name == "step_000001"
    monkeypatch.setattr(torch, "save", real_save)
    result = CliRunner().invoke(app, ["train", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["checkpoint_failures"] == 0  # the resumed part wrote every checkpoint
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [s for s in steps if s > 0] == [1, 2, 3, 4]  # rewound to the step-1 checkpoint, each step once
