"""Both training modes run the same RL step definition (relax_gym.trainer.run): a short colocate run and a short
async S = 0 run write checkpoints at the same steps and the same metrics keys (but for the keys only one mode has by
nature). A colocate run stopped by ``trainer.time_budget_s`` (a 1 ms budget: the first step always stops it) is
evaluated and checkpointed at that step; the async controller's stop on a spent budget is checked on the virtual
clock (tests/trainer/plan/test_controller_replay.py, at S = 0 and S = 2), not by a second Ray Serve run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="three short training runs, one of them on real Ray Serve"),
              pytest.mark.timeout(900)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
TINY = ["model.base=null", "trainer.steps=3", "trainer.sft_warmup_steps=1", "trainer.sft_batch_size=2", "trainer.prompts_per_step=2",
        "trainer.group_size=2", "trainer.eval_episodes=2", "trainer.eval_every=2", "trainer.checkpoint_every=2",
        "inference.max_new_tokens=8", "metrics.tensorboard=false", "trainer.max_staleness=0", "roles.bus=inprocess"]
# by nature in one mode only: the async actor's versions, staleness, data wait and bus counts; colocate's lr (the
# async actor sets its lr itself). status_<s> counts depend on what the sampled episodes did.
ASYNC_ONLY = {"trained_version", "rollout_version_min", "rollout_version_max", "staleness_avg", "staleness_max",
              "data_wait_s", "data_wait_fraction", "partial_groups", "samples_consumed", "bus_bytes_put",
              "bus_media_bytes_saved"}
COLOCATE_ONLY = {"lr"}


def run(tmp_path: Path, name: str, mode: str, budget: str) -> tuple[list[int], dict[int, set[str]]]:
    run_dir = tmp_path / name
    args = ["train", str(RECIPE), *TINY, f"trainer.mode={mode}", f"trainer.time_budget_s={budget}", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    ckpts = sorted(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))
    keys: dict[int, set[str]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        keys.setdefault(row["step"], set()).update(k for k in row if not k.startswith("status_"))
    return ckpts, keys


def test_colocate_and_async_write_the_same_checkpoints_and_metrics(ray_session, tmp_path):
    colocate_ckpts, colocate = run(tmp_path, "colocate-null", "colocate", "null")
    async_ckpts, async_ = run(tmp_path, "async-null", "async", "null")
    assert colocate_ckpts == async_ckpts == [2, 3]
    assert sorted(colocate) == sorted(async_) == [-1, 0, 1, 2, 3]  # the same rows: warm-up, eval at 0, each step
    for step in colocate:
        assert colocate[step] - COLOCATE_ONLY == async_[step] - ASYNC_ONLY, step
    assert {"eval_reward", "eval_accuracy", "eval_format", "accuracy_mean", "format_mean"} <= colocate[3]
    # a spent time budget: the first step ends the run, with that step's eval and checkpoint (neither due)
    stopped_ckpts, stopped = run(tmp_path, "colocate-0.001", "colocate", "0.001")
    assert stopped_ckpts == [1] and sorted(stopped) == [-1, 0, 1]
    assert {"eval_reward", "eval_accuracy", "eval_format"} <= stopped[1]
    no_eval = lambda keys: {k for k in keys if not k.startswith("eval_")}  # noqa: E731
    assert no_eval(stopped[1]) == no_eval(colocate[1])  # the same step row, with the eval the stop brought
    # the async S = 0 run (stragglers=wait) files each step's train episodes by their place in the step, once each
    records = {p.name: [json.loads(x) for x in p.read_text().splitlines()]
               for p in (tmp_path / "async-null" / "rollouts").glob("step_*.jsonl")}
    assert [r["kind"] for r in records["step_000000.jsonl"]] == ["eval", "eval"]
    for step in (1, 2, 3):
        assert sorted(r["index"] for r in records[f"step_{step:06d}.jsonl"] if r["kind"] == "train") == list(range(4))
