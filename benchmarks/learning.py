"""Learning: run a recipe (default: the `make train` one) for several seeds and print held-out eval reward at the
start (after the format warm-up) and at the end, with the gain; then the embedded engine's tokens/s against plain
``model.generate`` on the same model and batch (ratio, same run).

    python benchmarks/learning.py [--recipe recipes/cpu-nextqa.yaml] [--load N] [override ...] [--seeds 0 1]

(Overrides go before ``--seeds``: after it every word is read as a seed.)

Each seed is one full run (the recipe's time budget: 10 minutes). Run dirs go to runs/bench-learning[-<recipe>]-seed<N>[-load<L>]. A recipe
that names ``model.base`` builds it first when the cache lacks it; that time is reported on its own (``base_s``)
and is not part of a run's minutes. ``--load N`` keeps N busy-loop processes running beside every run (a laptop
with other work on it); they stop when the runs end.

Per seed: eval reward at the start (after the warm-up), at the end, the best, and ``eval_at_10min``: the last eval
within 600 s of the run's start (the warm-up counted), the figure `make train`'s target is stated on.

``run(quick)`` returns the figures as a dict. ``quick=True`` is a smoke run, not the learning figure: one seed, a
short warm-up and 8 RL steps (under a minute on the reference machine), to exercise the pipeline end to end; its
eval rewards say nothing about whether the recipe learns within 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from relax_gym.trainer.base.build import ensure_base
from relax_gym.trainer.colocate import ColocateTrainer
from relax_gym.trainer.config import load_recipe
from relax_gym.trainer.tools import engine_bench


def start_load(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy (a Python busy loop) until terminated."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _eval_within(run_dir: Path, seconds: float) -> float:
    """The last held-out eval reward logged within ``seconds`` of the run's start."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_reward"] for r in rows if "eval_reward" in r and r.get("elapsed_s", 0.0) <= seconds]
    return evals[-1] if evals else float("nan")


def _best_eval(run_dir: Path) -> tuple[float, int]:
    """The highest held-out eval reward the run reached, and at which step (for the curve's shape, not the bar)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["eval_reward"], r["step"]) for r in rows if "eval_reward" in r]
    reward, step = max(evals)
    return reward, step


# A smoke-sized run of the same recipe: the pipeline end to end, not the 10-minute learning figure (and without the
# recipe's base, whose first build takes ~5 minutes: the smoke run starts from a random policy).
QUICK_OVERRIDES = ["model.base=null", "trainer.steps=8", "trainer.sft_warmup_steps=15", "trainer.eval_every=8", "trainer.eval_episodes=16",
                   "trainer.checkpoint_every=1000", "trainer.time_budget_s=150", "metrics.tensorboard=false"]


def run(quick: bool = False, *, recipe: str = "recipes/cpu-nextqa.yaml", seeds: list[int] | None = None,
        overrides: list[str] | tuple[str, ...] = (), load: int = 0) -> dict:
    """Train ``recipe`` once per seed and measure the engine's throughput. Returns ``{"recipe", "quick",
    "overrides", "seeds": [{"seed", "steps", "minutes", "eval_reward_start", "eval_reward_end", "gain",
    "eval_accuracy_end", "best_eval_reward", "best_step", "run_dir"}], "engine": {...}}`` (``engine``: what
    :func:`relax_gym.trainer.tools.engine_bench.run` returns)."""
    seeds = seeds if seeds is not None else ([0] if quick else [0, 1])
    overrides = [*(QUICK_OVERRIDES if quick else []), *overrides]
    rows = []
    base_s = None
    first = load_recipe(recipe, list(overrides))
    if first.model.base is not None:  # built (or found) before any run and before the load starts
        t0 = time.perf_counter()
        info = ensure_base(first.model.base, first.model)
        base_s = {"seconds": time.perf_counter() - t0, "built": info.built, "report_seconds": info.report["seconds"]}
    busy = start_load(load)
    try:
        rows = _runs(recipe, seeds, overrides, quick, load)
    finally:
        for p in busy:
            p.terminate()
            p.wait(10)
    # the engine's throughput ratio is a quiet-machine figure: not measured beside a load
    engine = None if load else (engine_bench.run(repeats=2) if quick else engine_bench.run())
    return {"recipe": recipe, "quick": quick, "overrides": overrides, "load": load, "base": base_s, "seeds": rows,
            "engine": engine}


def run_dir_of(recipe: str, seed: int, quick: bool = False, load: int = 0) -> Path:
    """runs/bench-learning[-quick][-<recipe>]-seed<N>[-load<L>] (the default recipe's name is left out)."""
    stem = Path(recipe).stem
    tag = "" if stem == "cpu-nextqa" else f"-{stem}"
    return Path("runs") / f"bench-learning{'-quick' if quick else ''}{tag}-seed{seed}{f'-load{load}' if load else ''}"


def _runs(recipe: str, seeds: list[int], overrides: list[str], quick: bool, load: int) -> list[dict]:
    rows = []
    for seed in seeds:
        run_dir = run_dir_of(recipe, seed, quick, load)
        cfg = load_recipe(recipe, [*overrides, f"trainer.seed={seed}", f"model.seed={seed}"])
        shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl appends: a rerun must not mix with the last
        trainer = ColocateTrainer(cfg, run_dir)
        try:
            s = trainer.run()
        finally:
            trainer.close()
        best_reward, best_step = _best_eval(run_dir)
        rows.append({"seed": seed, "steps": s["steps"], "minutes": s["elapsed_s"] / 60,
                     "eval_reward_start": s["eval_reward_start"], "eval_reward_end": s["eval_reward_end"],
                     "eval_at_10min": _eval_within(run_dir, 600.0),
                     "gain": s["eval_reward_end"] - s["eval_reward_start"], "eval_accuracy_end": s.get("eval_accuracy_end", 0.0),
                     "best_eval_reward": best_reward, "best_step": best_step, "run_dir": str(run_dir)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/cpu-nextqa.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes kept running beside the runs")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every seed")
    args = parser.parse_args()
    result = run(recipe=args.recipe, seeds=args.seeds, overrides=args.overrides, load=args.load)
    if result["base"] is not None:
        b = result["base"]
        Console().print(f"base: {'built' if b['built'] else 'from the cache'} in {b['seconds']:.1f} s (build report: {b['report_seconds']})")
    table = Table("seed", "steps", "minutes", "eval reward start", "eval at 10 min", "eval reward end", "gain", "eval accuracy end",
                  "best eval reward (step)", title=f"learning: {args.recipe} (load {args.load})")
    for r in result["seeds"]:
        table.add_row(str(r["seed"]), str(r["steps"]), f"{r['minutes']:.1f}", f"{r['eval_reward_start']:.3f}",
                      f"{r['eval_at_10min']:.3f}", f"{r['eval_reward_end']:.3f}", f"{r['gain']:+.3f}", f"{r['eval_accuracy_end']:.3f}",
                      f"{r['best_eval_reward']:.3f} ({r['best_step']})")
    Console().print(table)
    if result["engine"] is not None:
        Console().print(result["engine"])


if __name__ == "__main__":
    main()
