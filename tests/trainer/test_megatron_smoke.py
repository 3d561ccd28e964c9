"""The megatron backend end to end: a 2-step colocate run of the default recipe with ``actor.backend=megatron``
(SFT warm-up, rollouts against the embedded engine, RL steps, weight pushes, eval, a dist_checkpointing checkpoint),
and the ``megatron_check`` CLI's answer without CUDA. (The CLI's CPU run is checked where scripts/gpu_check.sh runs
it: tests/trainer/tools/test_gpu_check.py's dry run asserts its whole JSON line.)"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from relax_gym.cli import app

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
SMALL = ["model.base=null", "trainer.steps=2", "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=4", "trainer.prompts_per_step=2",
         "trainer.group_size=2", "trainer.eval_episodes=2", "trainer.eval_every=2", "trainer.checkpoint_every=2",
         "metrics.tensorboard=false"]


@pytest.mark.timeout(600)
def test_colocate_run_with_the_megatron_backend(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(RECIPE), "actor.backend=megatron", *SMALL, "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in rows if r["step"] < 0]
    assert len(sft) == 2 and all(math.isfinite(r["sft_nll"]) and r["grad_norm"] > 0 for r in sft)
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert rows[-1]["policy_version"] == 1 + 2  # warm-up push + one per step, all through HF names
    assert json.loads((run_dir / "config.json").read_text())["actor"]["backend"] == "megatron"
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "megatron" / "metadata.json").is_file() and (ckpt / "trainer_state.pt").is_file()
    assert not list(ckpt.glob("*.safetensors"))  # the weights are in the dist checkpoint
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and 0.0 <= summary["eval_reward_end"] <= 1.0
    import torch.distributed as dist

    assert not dist.is_initialized()  # the trainer's close tore megatron-core down


def check(device: str, steps: int) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "relax_gym.trainer.tools.megatron_check", "--device", device,
                           "--steps", str(steps)], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr[-2000:]
    return proc.returncode, json.loads(lines[0])


@pytest.mark.timeout(360)
def test_megatron_check_cli_on_cuda_runs_or_says_cuda_is_missing():
    if torch.cuda.is_available():  # a GPU machine: the real check
        rc, summary = check("cuda", 1)
        assert rc == 0 and summary["ok"] is True and summary["device"].startswith("cuda"), summary
        return
    rc, summary = check("cuda", 0)
    assert rc == 2 and summary == {"ok": False, "device": "cuda", "failures": ["no CUDA device visible to torch"]}
