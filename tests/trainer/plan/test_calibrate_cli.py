"""``plan calibrate`` recovers the costs of a run the simulator made (a round trip), and the ``plan`` commands run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.trainer.plan.calibrate import calibrate, tool_waits
from relax_gym.trainer.plan.cli import parse_model_size, plan_app
from relax_gym.trainer.plan.costs import (
    Costs,
    Dist,
    EpisodeCost,
    GenerationCost,
    SyncCost,
    TrainCost,
)
from relax_gym.trainer.plan.schedule import simulate

TRAINER = {"mode": "colocate", "steps": 6, "prompts_per_step": 4, "group_size": 2, "concurrency": 64, "seed": 0,
           "max_turns": 3}
SHAPE = (2, 120, 300, 1)  # turns, completion tokens, other tokens, tool calls that waited


def _true_costs() -> Costs:
    return Costs(episode=EpisodeCost(empirical=(SHAPE,), tool_s=Dist.fixed(0.5)),
                 generation=GenerationCost(peak_tokens_per_s=500.0, half_batch=4.0, max_batch=256),
                 train=TrainCost(s_per_token=1e-3, micro_batch_size=4), sync=SyncCost(colocate_push_s=0.02))


def _write_run(tmp: Path, timing: dict | None = None) -> Path:
    """A colocate run dir as the trainer writes it, its figures from the simulator with known costs."""
    res = simulate(_true_costs(), TRAINER)
    run = tmp / "run"
    (run / "rollouts").mkdir(parents=True)
    config = {"trainer": TRAINER, "env": {"id": "tool-use", "kwargs": {"tool_latency": {"dist": "fixed", "median_s": 0.5}}},
              "inference": {"max_new_tokens": 512, "max_batch": 256}, "actor": {"micro_batch_size": 4},
              "algorithm": {"kl_coef": 0.0}, "roles": {"inference": {"replicas": 1}}}
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [{"step": 0, "eval_reward": 0.0}, *res.rows]) + "\n")
    call = {"type": "tool_call", "name": "python", "arguments": "{}"}
    bad = {"type": "tool_call", "error": "<tool_call> is not closed", "raw": "<tool_call>"}
    for step in range(1, TRAINER["steps"] + 1):
        records = [{"step": step, "kind": "train", "group": g, "reward": float(m), "trainable": True, "turns": SHAPE[0],
                    "completion_tokens": SHAPE[1], "prompt_tokens": SHAPE[2], "tool_calls": 2,
                    "messages": [{"role": "assistant", "parts": [call, bad]}], **({"timing": timing} if timing else {})}
                   for g in range(2) for m in range(2)]
        (run / "rollouts" / f"step_{step:06d}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return run


def test_calibrate_recovers_the_costs_of_a_simulated_run(tmp_path):
    fit = calibrate(_write_run(tmp_path), half_batch=4.0, push_s=0.3)
    c = fit.costs
    assert set(c.episode.empirical) == {SHAPE} and c.episode.tool_s == Dist.from_tool_latency({"dist": "fixed", "median_s": 0.5})
    assert c.generation.peak_tokens_per_s == pytest.approx(500.0, rel=0.01)
    assert c.train.s_per_token == pytest.approx(1e-3, rel=0.01) and c.train.micro_batch_size == 4
    assert c.sync.colocate_push_s == pytest.approx(0.02) and c.sync.push_s == 0.3
    assert c.episode.zero_adv_group_share == 0.0  # pairs of 0/1 rewards never tie in the simulator
    r = fit.report
    assert r["given"]["episode.tool_s"] and r["missing"] and "generation.half_batch" in r["assumed"]
    assert all(k.startswith(("episode", "generation", "train", "sync", "cluster")) for k in c.notes)


def test_recorded_episode_timings_give_the_reset_and_the_call_figures(tmp_path):
    timing = {"reset_s": 0.04, "generate_s": [0.3, 0.5], "env_s": [0.52, 0.01], "wall_s": 1.4}
    fit = calibrate(_write_run(tmp_path, timing), half_batch=4.0)
    assert fit.costs.episode.reset_s.kind == "empirical" and set(fit.costs.episode.reset_s.samples) == {0.04}
    t = fit.report["episode_timing"]
    assert t["episodes"] == 6 * 4 and t["engine_call_s_median"] == pytest.approx(0.4)
    assert t["env_step_s_mean"] == pytest.approx(0.265) and t["episode_wall_s_mean"] == pytest.approx(1.4)
    assert "episode.reset_s" in fit.report["fitted"]
    assert not any("wall times" in m for m in fit.report["missing"])
    old = calibrate(_write_run(tmp_path / "old"), half_batch=4.0)  # records from before timings: said so
    assert old.report["episode_timing"] == {} and any("wall times" in m for m in old.report["missing"])


def test_tool_waits_count_parsed_calls_only():
    call, bad = {"type": "tool_call", "name": "python"}, {"type": "tool_call", "error": "not closed"}
    assert tool_waits({"messages": [{"parts": [call, bad, call]}], "tool_calls": 3}) == 2
    assert tool_waits({"tool_calls": 3}) == 3  # no messages recorded: every call counts


def test_model_sizes_parse():
    assert parse_model_size("4B") == 4e9 and parse_model_size("500m") == 5e8 and parse_model_size("7e9") == 7e9


def test_plan_commands(tmp_path):
    costs = tmp_path / "costs.yaml"
    _true_costs().with_updates(cluster={"gpus": 3, "replicas": 1}).to_yaml(costs)
    assert Costs.from_yaml(costs) == _true_costs().with_updates(cluster={"gpus": 3, "replicas": 1})
    runner = CliRunner()
    small = ["trainer.steps=4", "trainer.prompts_per_step=2", "trainer.group_size=2"]
    log = tmp_path / "events.jsonl"
    res = runner.invoke(plan_app, ["run", "--costs", str(costs), *small, "trainer.mode=async", "trainer.max_staleness=1",
                                   "--log", str(log)])
    assert res.exit_code == 0, res.output
    assert "async S=1" in res.output and log.read_text().count("\n") > 10
    out = tmp_path / "sweep"
    res = runner.invoke(plan_app, ["sweep", "--costs", str(costs), *small, "--replicas", "1,2", "--staleness", "1",
                                   "--stragglers", "wait", "--model-size", "1B", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "sweep.json").read_text())
    assert [p["replicas"] for p in data["points"]] == [1, 2] and (out / "sweep.png").stat().st_size > 0
    assert data["inputs"]["costs"]["sync"]["weight_bytes"] == 2e9
    res = runner.invoke(plan_app, ["calibrate", str(_write_run(tmp_path)), "--out", str(tmp_path / "fit.yaml")])
    assert res.exit_code == 0, res.output
    assert "fitted" in res.output and Costs.from_yaml(tmp_path / "fit.yaml").generation.peak_tokens_per_s > 0
