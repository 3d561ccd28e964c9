"""Convergence of the trainer modes: colocate, async on-policy (S=0) and async off-policy (S=2, carry) from the same
base on the default recipe, same seed and the same sample budget (steps x prompts x group), each to a final held-out
reward. Relax's claim is that the three converge to the same reward; this shows ours at a reward where learning has
happened, not at chance.

    python benchmarks/convergence.py [--quick] [--steps 120] [--seed 0] [--eval-every 20]

Printed per mode: steps, loop seconds, steps/hour and the ratio to colocate, eval reward at start and end, best.
The chart (runs/bench-convergence/full/convergence.png, copied to docs/img/convergence.png) has each mode's held-out
reward against the step and against wall time. Targets (issue 18): final rewards within +-0.05 of each other at a
final reward >= 0.6.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

from _trainer_run import train_once
from rich.console import Console
from rich.table import Table

from relax_gym.trainer.base.build import ensure_base
from relax_gym.trainer.config import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "cpu-nextqa.yaml"
OUT = Path("runs") / "bench-convergence"
MODES = {
    "colocate": ["trainer.mode=colocate"],
    "async S=0": ["trainer.mode=async", "trainer.max_staleness=0", "roles.env_worker.replicas=2"],
    "async S=2 carry": ["trainer.mode=async", "trainer.max_staleness=2", "roles.env_worker.replicas=2",
                        "trainer.stragglers=carry"],
}


def run_mode(mode: str, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    summary, rows, steps, loop_s = train_once(load_recipe(RECIPE, overrides + MODES[mode]), run_dir)
    curve = [(r["step"], r.get("elapsed_s", 0.0), r["eval_reward"]) for r in rows if "eval_reward" in r]
    return {"steps": len(steps), "loop_s": loop_s, "steps_per_hour": 3600.0 * len(steps) / loop_s,
            "eval_reward_start": summary["eval_reward_start"], "eval_reward_end": summary["eval_reward_end"],
            "best_eval_reward": max(c[2] for c in curve), "curve": curve, "run_dir": str(run_dir)}


def chart(results: dict[str, dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for mode, r in results.items():
        steps, secs, rewards = zip(*r["curve"])
        label = f"{mode} ({r['steps_per_hour']:.0f} steps/h)"
        by_step.plot(steps, rewards, marker="o", label=label)
        by_time.plot([s / 60 for s in secs], rewards, marker="o", label=label)
    by_step.set_xlabel("RL step")
    by_time.set_xlabel("minutes since the run started (warm-up included)")
    by_step.set_ylabel("held-out eval reward (greedy, 200 val clips)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    by_step.legend(loc="lower right")
    fig.suptitle("colocate vs async on-policy vs async off-policy, same base, seed and samples")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# quick: the three modes end to end on a few steps, from a random policy (no 5-minute base build): a smoke run,
# not the convergence figure
QUICK = ["model.base=null", "trainer.sft_warmup_steps=4", "trainer.sft_batch_size=8", "trainer.prompts_per_step=4",
         "trainer.eval_episodes=8"]


def run(quick: bool = False, *, steps: int | None = None, seed: int = 0, eval_every: int | None = None) -> dict[str, Any]:
    """The three modes from the same base, seed and samples. Returns ``{"modes": {mode: {"steps", "loop_s",
    "steps_per_hour", "speedup", "eval_reward_start", "eval_reward_end", "best_eval_reward", "curve": [(step,
    elapsed_s, eval_reward)], "run_dir"}}, "targets": {name: bool}, "workload": {...}}``."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    steps = steps or (4 if quick else 120)
    eval_every = eval_every or (2 if quick else 20)
    if not quick:
        base = load_recipe(RECIPE, [])
        ensure_base(base.model.base, base.model)  # built once before any mode, so no mode pays for it
    common = [*(QUICK if quick else []), f"trainer.seed={seed}", f"trainer.steps={steps}", "trainer.time_budget_s=null",
              f"trainer.eval_every={eval_every}", f"trainer.checkpoint_every={steps}", "metrics.tensorboard=false"]
    out = OUT / ("quick" if quick else "full")
    results = {mode: run_mode(mode, common, out / mode.replace(" ", "-").replace("=", "")) for mode in MODES}
    ref = results["colocate"]
    for r in results.values():
        r["speedup"] = r["steps_per_hour"] / ref["steps_per_hour"]
    finals = [r["eval_reward_end"] for r in results.values()]
    targets = {"final eval rewards within +-0.05 of each other": max(finals) - min(finals) <= 0.05,
               "every final eval reward >= 0.6": min(finals) >= 0.6}
    return {"modes": results, "targets": targets, "workload": {"recipe": str(RECIPE), "steps": steps, "seed": seed, "quick": quick}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 steps per mode from a random policy: a smoke run")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=None)
    args = parser.parse_args()
    result = run(args.quick, steps=args.steps, seed=args.seed, eval_every=args.eval_every)
    table = Table("mode", "steps", "loop s", "steps/h", "x colocate", "eval start", "eval end", "best",
                  title=f"convergence: {RECIPE.name}, {result['workload']['steps']} steps, seed {args.seed}")
    for mode, r in result["modes"].items():
        table.add_row(mode, str(r["steps"]), f"{r['loop_s']:.0f}", f"{r['steps_per_hour']:.0f}", f"{r['speedup']:.2f}",
                      f"{r['eval_reward_start']:.3f}", f"{r['eval_reward_end']:.3f}", f"{r['best_eval_reward']:.3f}")
    console = Console(width=140)
    console.print(table)
    for name, ok in result["targets"].items():
        console.print(f"{'met' if ok else 'NOT met'}: {name}")
    out = OUT / ("quick" if args.quick else "full")
    png = chart(result["modes"], out / "convergence.png")
    if not args.quick:
        shutil.copy(png, ROOT / "docs" / "img" / "convergence.png")
    console.print(f"chart: {png}" + ("" if args.quick else " (and docs/img/convergence.png)"))
    (out / "last.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
