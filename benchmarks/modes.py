"""Trainer modes on a long-tail agentic workload: colocate vs async S=0 vs async S=2, in one run.

The workload is the tool-use env (recipes/cpu-tool-use.yaml: 8 prompts x 4 answers per step, up to 3 turns, python
tool in a sandbox) with a simulated tool latency drawn from a seeded lognormal (median 1 s, sigma 1.2, capped at
30 s: most calls are quick, a few take many seconds), so a synchronous step waits for its slowest episode. The
policy is warmed up once (SFT on gold tool-use demonstrations, without the latency, until its sampled answers hold
valid tool calls) and every mode starts from that checkpoint with the same seed and step count. Printed per mode: RL steps/hour and the ratio to colocate, the final
greedy eval reward, and the trainer's data-wait fraction (async: time the actor waited for micro-batches / step
time; colocate: rollout time / step time, the share of each step its trainer sits idle).

    python benchmarks/modes.py [--quick] [--steps N] [--seed S] [--median S] [--sigma X] [--max-s S]
                               [--modes "colocate,async S=2 carry"] [--eval-episodes N]

Targets (issue "Async engine"): async S=2 >= 2x colocate steps/hour; final eval rewards within +-0.05 of
colocate; data wait <= 2 % of step time in async mode. Issue 21 raised the carry target to >= 2.5x with Docker
sandboxes (the backend: $RELAX_GYM_SANDBOX, else Docker when an engine answers, else bwrap; printed). The machine
(CPU model, cores) and the load average before and after are printed and kept in runs/bench-modes/last.json:
steps/hour do not compare across machines, and the ratios move with the machine's speed too (generation and
training shrink next to the tool latency on a faster one; docs/benchmarks.md). Run dirs go to runs/bench-modes/<mode>.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from _trainer_run import train_once
from rich.console import Console
from rich.table import Table

from relax_gym.bench.command import machine
from relax_gym.sandbox.backends import select_backend
from relax_gym.trainer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "cpu-tool-use.yaml"
OUT = Path("runs") / "bench-modes"
LATENCY = {"dist": "lognormal", "median_s": 1.0, "sigma": 1.2, "max_s": 30.0}
MODES = {
    "colocate": ["trainer.mode=colocate", "trainer.max_staleness=0"],
    "async S=0": ["trainer.mode=async", "trainer.max_staleness=0", "roles.env_worker.replicas=2"],
    "async S=2": ["trainer.mode=async", "trainer.max_staleness=2", "roles.env_worker.replicas=2"],
    "async S=2 carry": ["trainer.mode=async", "trainer.max_staleness=2", "roles.env_worker.replicas=2",
                        "trainer.stragglers=carry"],
}
TARGET_MODE = "async S=2 carry"  # the async engine's answer to the long tail: steps train on the first groups done
DOCKER_TARGET = 2.5  # issue 21: carry's ratio to colocate with Docker sandboxes


def _env_kwargs(seed: int | None, latency: dict[str, Any] | None = None) -> str:
    if seed is None:
        return "env.kwargs={}"
    spec = ", ".join(f"{k}: {v}" for k, v in {**(latency or LATENCY), "seed": seed}.items())
    return f"env.kwargs={{tool_latency: {{{spec}}}}}"


def warm_start(seed: int, sft_steps: int, out: Path, demos: int = 64) -> Path:
    """The policy every mode starts from: a tiny thinker after ``sft_steps`` SFT steps (batches of 16) on ``demos``
    gold tool-use demonstrations (made once, without the latency). A tiny policy needs that many steps before its
    *sampled* answers hold valid tool calls, and only valid calls reach the tool and wait."""
    import random

    import numpy as np
    import torch

    import relax_gym
    from relax_gym.trainer.actors.hf import HFActor
    from relax_gym.trainer.policy import build_policy, save_policy
    from relax_gym.trainer.run.warmup import demonstration

    target = out / "warm-policy"
    if (target / "config.json").is_file():
        return target
    cfg = load_recipe(RECIPE, [f"model.seed={seed}", _env_kwargs(None)])
    torch.manual_seed(seed)
    model, processor = build_policy(cfg.model)
    actor = HFActor(model, processor, lr=cfg.trainer.sft_lr, micro_batch_size=cfg.actor.micro_batch_size)
    env = relax_gym.make(cfg.env.id, **cfg.env.kwargs)
    rng = np.random.default_rng(seed)
    data = [demonstration(env, processor, 1_000_000 + i, rng, random_answers=False) for i in range(demos)]
    env.close()
    pick = random.Random(seed)
    for _ in range(sft_steps):
        actor.sft_step(pick.sample(data, 16))
    save_policy(model, processor, target)
    return target


def run_mode(mode: str, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    cfg = load_recipe(RECIPE, overrides + MODES[mode])
    summary, rows, steps, loop_s = train_once(cfg, run_dir)
    waited = "data_wait_s" if cfg.trainer.mode == "async" else "time_rollout_s"
    fill = cfg.trainer.max_staleness + 1  # steps before the pipeline is full (S + 1 rollouts in flight)

    def share(rs: list[dict[str, Any]]) -> float:
        return sum(r[waited] for r in rs) / sum(r["time_step_s"] for r in rs) if rs else float("nan")

    return {
        "steps": len(steps), "loop_s": loop_s, "steps_per_hour": 3600.0 * len(steps) / loop_s,
        "eval_reward_end": summary["eval_reward_end"], "eval_reward_start": summary["eval_reward_start"],
        "data_wait_fraction": share(steps), "data_wait_fraction_steady": share(steps[fill:]),
        "rollout_s_mean": sum(r["time_rollout_s"] for r in steps) / len(steps),
        "train_s_mean": sum(r["time_train_s"] for r in steps) / len(steps), "staleness_max": max((r.get("staleness_max", 0) for r in steps), default=0),
        "tool_calls_eval": next((r["eval_tool_calls"] for r in reversed(rows) if "eval_tool_calls" in r), 0.0),
        "samples_produced": summary.get("samples_produced"), "samples_consumed": summary.get("samples_consumed"),
        "samples_discarded_stale": summary.get("samples_discarded_stale", 0), "samples_lost": summary.get("samples_lost"),
        "run_dir": str(run_dir),
    }


def run(quick: bool = False, *, steps: int | None = None, seed: int = 0, latency: dict[str, Any] | None = None,
        modes: list[str] | None = None, eval_episodes: int | None = None) -> dict[str, Any]:
    """Run the modes on the same workload; returns per-mode figures, ratios and the targets' verdicts.
    ``latency`` overrides fields of the tool-latency distribution (:data:`LATENCY`); ``modes``: a subset of
    :data:`MODES` (ratios and targets need colocate and the target mode among them)."""
    modes = modes or list(MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}: choose from {list(MODES)}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    load_before = os.getloadavg()[0]
    sandbox = select_backend().name  # what the tool calls run in (every role resolves it the same way)
    steps = steps or (4 if quick else 12)
    latency = {**LATENCY, **(latency or {})}
    tag = "" if latency == LATENCY else "-" + "-".join(f"{k}{v}" for k, v in latency.items() if LATENCY[k] != v)
    out = OUT / (("quick" if quick else "full") + tag)
    warm = warm_start(seed, 100 if quick else 150, OUT / ("quick" if quick else "full"))  # shared by latency variants
    common = [f"model.path={warm}", "trainer.sft_warmup_steps=0", f"trainer.seed={seed}", f"trainer.steps={steps}",
              f"trainer.eval_every={steps}", f"trainer.checkpoint_every={steps}",
              f"trainer.eval_episodes={eval_episodes or (16 if quick else 32)}", _env_kwargs(seed, latency),
              "metrics.tensorboard=false"]
    results = {mode: run_mode(mode, common, out / mode.replace(" ", "-").replace("=", "")) for mode in modes}
    base = results.get("colocate")
    for r in results.values():
        r["speedup"] = r["steps_per_hour"] / base["steps_per_hour"] if base else float("nan")
        r["eval_delta"] = r["eval_reward_end"] - base["eval_reward_end"] if base else float("nan")
    targets = {}
    if base and TARGET_MODE in results:
        s2 = results[TARGET_MODE]
        targets = {
            f"{TARGET_MODE} >= 2x colocate steps/hour": s2["speedup"] >= 2.0,
            "final eval rewards within +-0.05": all(abs(r["eval_delta"]) <= 0.05 for r in results.values()),
            f"{TARGET_MODE} data wait <= 2% of step time": s2["data_wait_fraction"] <= 0.02,
        }
        if sandbox == "docker":
            targets[f"{TARGET_MODE} >= {DOCKER_TARGET}x colocate with Docker sandboxes"] = s2["speedup"] >= DOCKER_TARGET
    return {"modes": results, "targets": targets,
            "workload": {"recipe": str(RECIPE), "latency": latency, "steps": steps, "seed": seed, "quick": quick,
                         "sandbox": sandbox},
            "machine": {"description": machine(), "load_before": load_before, "load_after": os.getloadavg()[0]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 steps, 16 eval episodes, short warm-up")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--median", type=float, default=LATENCY["median_s"], help="tool latency median, seconds")
    parser.add_argument("--sigma", type=float, default=LATENCY["sigma"], help="spread of the log-latency (tail weight)")
    parser.add_argument("--max-s", type=float, default=LATENCY["max_s"], help="cap of one tool call's latency")
    parser.add_argument("--modes", default=None, help=f"comma-separated subset of {list(MODES)}")
    parser.add_argument("--eval-episodes", type=int, default=None, help="eval episodes at the start and the end")
    args = parser.parse_args()
    latency = {"median_s": args.median, "sigma": args.sigma, "max_s": args.max_s}
    result = run(args.quick, steps=args.steps, seed=args.seed, latency=latency,
                 modes=[m.strip() for m in args.modes.split(",")] if args.modes else None, eval_episodes=args.eval_episodes)
    table = Table("mode", "steps", "loop s", "steps/h", "x colocate", "eval end", "delta", "data wait", "after fill",
                  "rollout s", "train s", "stale max", "discarded",
                  title=f"trainer modes, tool-use + tool latency {result['workload']['latency']} ({result['workload']['steps']} steps)")
    for mode, r in result["modes"].items():
        table.add_row(mode, str(r["steps"]), f"{r['loop_s']:.0f}", f"{r['steps_per_hour']:.0f}", f"{r['speedup']:.2f}",
                      f"{r['eval_reward_end']:.3f}", f"{r['eval_delta']:+.3f}", f"{100 * r['data_wait_fraction']:.1f}%",
                      f"{100 * r['data_wait_fraction_steady']:.1f}%", f"{r['rollout_s_mean']:.1f}", f"{r['train_s_mean']:.1f}",
                      str(r["staleness_max"]), str(r["samples_discarded_stale"]))
    console = Console(width=160)
    console.print(table)
    m = result["machine"]
    console.print(f"sandbox backend: {result['workload']['sandbox']}; machine: {m['description']}; load average "
                  f"{m['load_before']:.2f} before, {m['load_after']:.2f} after (this run's own roles included)")
    console.print("data wait: async = actor waiting for micro-batches / step time; colocate = rollout time / step time;"
                  " after fill = without the first S + 1 steps")
    for name, ok in result["targets"].items():
        console.print(f"{'met' if ok else 'NOT met'}: {name}")
    (OUT / "last.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
