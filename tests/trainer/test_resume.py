"""``relax-gym train --resume`` in colocate mode: a run stopped at step 4 (a kill fault: in colocate mode the
trainer process is every role) and resumed from its step-2 checkpoint ends bit-identical to an uninterrupted run of
the same length — weights, optimizer state and every metrics row but the timings.

That needs a deterministic loop: ``trainer.concurrency=1`` runs the episodes one after another, so the engine samples
each request alone, in the same order, from the restored random state. With concurrent episodes the engine batches
requests by arrival time, and which requests share a batch changes the sampled tokens: two uninterrupted runs differ
then too, and a resumed run matches only in distribution. A time budget (``trainer.time_budget_s``) makes the
learning-rate schedule follow the clock, which is not reproducible either; it is off here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from relax_gym.cli import app

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
SMALL = ["model.base=null", "trainer.steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=2", "trainer.eval_episodes=2",
         "trainer.sft_warmup_steps=6", "trainer.sft_batch_size=4", "trainer.prompts_per_step=2", "trainer.group_size=4",
         "trainer.concurrency=1", "trainer.time_budget_s=null", "inference.max_new_tokens=16", "metrics.tensorboard=false",
         "algorithm.negative_advantage_scale=1.0", "algorithm.kl_coef=0.05",
         # the lr decay starts after step 2 (any reward passes -1 once 2 steps are in): the resumed run must carry
         # that from the checkpoint, or its steps 3-4 would hold the peak lr
         "actor.lr_hold_until_reward=-1.0", "actor.lr_hold_window=2"]
TIMINGS = ("elapsed_s", "rollout_tokens_per_s")


def rows(run_dir: Path) -> list[dict]:
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k not in TIMINGS} for r in out]


@pytest.mark.timeout(600)
def test_a_resumed_colocate_run_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    runner = CliRunner()
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    result = runner.invoke(app, ["train", str(RECIPE), *SMALL, "--run-dir", str(whole)])
    assert result.exit_code == 0, result.output

    result = runner.invoke(app, ["train", str(RECIPE), *SMALL, "faults.inject=[{kind: kill, role: actor, at_step: 4}]",
                                 "--run-dir", str(cut)])
    assert result.exit_code == 1 and "--resume" in result.output
    assert [r["step"] for r in rows(cut) if r["step"] > 0] == [1, 2, 3]  # step 3 ran past the step-2 checkpoint
    result = runner.invoke(app, ["train", "--resume", str(cut)])
    assert result.exit_code == 0, result.output

    a, b = whole / "checkpoints" / "step_000004", cut / "checkpoints" / "step_000004"
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa, ob = torch.load(a / "optimizer.pt"), torch.load(b / "optimizer.pt")
    assert all(torch.equal(oa["state"][i][key], ob["state"][i][key]) for i in oa["state"] for key in ("exp_avg", "exp_avg_sq"))
    assert rows(whole) == rows(cut)  # SFT, eval and step rows: every value, each step once
    trained = [r for r in rows(whole) if r["step"] > 0]
    assert any(r["grad_norm"] > 0 for r in trained) and all("kl_ref" in r for r in trained if r.get("samples_forwarded"))
    assert json.loads((cut / "summary.json").read_text())["steps"] == 4


def test_resume_refuses_what_it_cannot_continue(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "no config.json" in result.output
    result = runner.invoke(app, ["train", str(RECIPE), "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "pass overrides only" in " ".join(result.output.split())
    run_dir = tmp_path / "run"
    small = ["model.base=null", "trainer.steps=1", "trainer.checkpoint_every=1", "trainer.sft_warmup_steps=0", "trainer.prompts_per_step=1",
             "trainer.group_size=2", "trainer.eval_episodes=1", "inference.max_new_tokens=4", "metrics.tensorboard=false"]
    assert runner.invoke(app, ["train", str(RECIPE), *small, "--run-dir", str(run_dir)]).exit_code == 0
    result = runner.invoke(app, ["train", "--resume", str(run_dir), "trainer.seed=5"])
    assert result.exit_code == 2 and "saved with trainer.seed=0, but the config says 5" in " ".join(result.output.split())
