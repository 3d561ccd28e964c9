"""PPO vs GRPO: the default recipe trained with each, on the same budget, and both held-out eval-reward curves on
one chart.

    python benchmarks/ppo_vs_grpo.py --seconds 600 [--seeds 0 1] [override ...]
    python benchmarks/ppo_vs_grpo.py --steps 200 [--x step] [--out runs/ppo_vs_grpo.png]
    python benchmarks/ppo_vs_grpo.py --quick      # or relax-gym bench ppo_vs_grpo --quick: a 3-step smoke run

GRPO runs ``recipes/cpu-nextqa.yaml`` and PPO ``recipes/cpu-nextqa-ppo.yaml``, which is the same recipe with
``algorithm.name: ppo`` (GAE knobs) and a ``critic:`` section: the script refuses a pair of recipes that differ
anywhere else, so the curves compare the algorithms and nothing more. The budget is a number of RL steps
(``--steps``: ``trainer.steps``, no time budget) or seconds (``--seconds``: ``trainer.time_budget_s``, the
warm-up counted as in every run); give one or both (neither: 600 s). Overrides apply to both runs (e.g. ``model.base=null``,
``trainer.eval_every=10``).

Each run is a run of benchmarks/learning.py's kind (the same figures, read the same way) in its own directory,
runs/bench-ppo-vs-grpo-<algorithm>[-quick]-seed<N> (emptied first; learning.py's directories are left alone). The chart
(``--out``, PNG) draws eval reward against run time (``--x time``, the default: the fair axis, since a PPO step also
runs the critic; the first point, the eval after the warm-up, sits at 0) or against the RL step (``--x step``), one
line per algorithm and seed; the table prints per run the steps, minutes, seconds per step, eval reward at the
start (after the warm-up), at the end, the best, and the gain.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from relax_gym.trainer.config import load_recipe

RECIPES = {"grpo": "recipes/cpu-nextqa.yaml", "ppo": "recipes/cpu-nextqa-ppo.yaml"}
ALGORITHM_SECTIONS = ("algorithm", "critic")  # where the two recipes may differ
DEFAULT_SECONDS = 600.0
QUICK_STEPS = 3
QUICK_OVERRIDES = ["model.base=null", "trainer.sft_warmup_steps=4", "trainer.eval_every=3", "trainer.eval_episodes=4",
                   "trainer.checkpoint_every=1000", "metrics.tensorboard=false"]


def _script(name: str) -> Any:
    """benchmarks/<name>.py, imported by path (the benchmarks are scripts, not a package)."""
    import importlib.util
    import sys

    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def run_dir_of(algorithm: str, seed: int, quick: bool = False) -> Path:
    """runs/bench-ppo-vs-grpo-<algorithm>[-quick]-seed<N> (a smoke run never empties a comparison's directory)."""
    return Path("runs") / f"bench-ppo-vs-grpo-{algorithm}{'-quick' if quick else ''}-seed{seed}"


def train(algorithm: str, recipe: str, seed: int, overrides: list[str], quick: bool = False) -> dict[str, Any]:
    """One run of ``recipe`` (seeded as benchmarks/learning.py seeds its runs) and its figures."""
    learning, once = _script("learning"), _script("_trainer_run")
    run_dir = run_dir_of(algorithm, seed, quick)
    cfg = load_recipe(recipe, [*overrides, f"trainer.seed={seed}", f"model.seed={seed}"])
    summary, _, _, _ = once.train_once(cfg, run_dir)
    best_reward, best_step = learning._best_eval(run_dir)
    return {"seed": seed, "steps": summary["steps"], "minutes": summary["elapsed_s"] / 60,
            "eval_reward_start": summary["eval_reward_start"], "eval_reward_end": summary["eval_reward_end"],
            "gain": summary["eval_reward_end"] - summary["eval_reward_start"], "best_eval_reward": best_reward,
            "best_step": best_step, "seconds_per_step": seconds_per_step(run_dir), "run_dir": str(run_dir)}


def budget_overrides(steps: int | None, seconds: float | None) -> list[str]:
    """The overrides that give both runs the same budget (steps, seconds, or whichever ends first)."""
    if steps is None and seconds is None:
        raise ValueError("give a budget: --steps N, --seconds S, or both")
    out = []
    if steps is not None:
        out.append(f"trainer.steps={steps}")
    out.append(f"trainer.time_budget_s={seconds if seconds is not None else 'null'}")
    return out


def check_same_recipe(recipes: dict[str, str], overrides: list[str]) -> None:
    """Refuse recipes that differ outside the algorithm and critic sections (or do not train what they say)."""
    dumps = {}
    for name, recipe in recipes.items():
        cfg = load_recipe(recipe, overrides)
        if cfg.algorithm.name != name:
            raise ValueError(f"{recipe} trains algorithm.name={cfg.algorithm.name!r}, not {name!r}")
        dumps[name] = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in ALGORITHM_SECTIONS}
    first, *others = dumps.values()
    for name, dump in zip(list(dumps)[1:], others):
        differ = sorted(k for k in first if first[k] != dump.get(k))
        if differ:
            raise ValueError(f"the {name} recipe differs from the others outside {ALGORITHM_SECTIONS}: {differ}")


def eval_curve(run_dir: Path, x: str) -> tuple[list[float], list[float]]:
    """(x, eval reward) of a run's eval rows: x is the run time in minutes (``time``) or the RL step (``step``)."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval_reward" in r and r["step"] >= 0]
    xs = [r.get("elapsed_s", 0.0) / 60.0 if x == "time" else float(r["step"]) for r in evals]
    return xs, [float(r["eval_reward"]) for r in evals]


def seconds_per_step(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [r["time_step_s"] for r in rows if r["step"] >= 1 and "time_step_s" in r]
    return sum(times) / len(times) if times else float("nan")


def plot(results: dict[str, list[dict[str, Any]]], out: Path, x: str, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"grpo": "tab:blue", "ppo": "tab:orange"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, runs in results.items():
        for i, r in enumerate(runs):
            xs, ys = eval_curve(Path(r["run_dir"]), x)
            ax.plot(xs, ys, marker="o", markersize=3, color=colours.get(name), alpha=1.0 if i == 0 else 0.6,
                    label=f"{name.upper()} seed {r['seed']}")
    ax.set_xlabel("run time (minutes, warm-up included)" if x == "time" else "RL step")
    ax.set_ylabel("held-out eval reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def run(quick: bool = False, *, steps: int | None = None, seconds: float | None = None, seeds: list[int] | None = None,
        overrides: list[str] | tuple[str, ...] = (), recipes: dict[str, str] | None = None, x: str = "time",
        out: Path = Path("runs/ppo_vs_grpo.png")) -> dict[str, Any]:
    """Train each recipe once per seed on the same budget; draw the chart. Returns ``{"quick", "budget",
    "overrides", "runs": {"grpo": [...], "ppo": [...]}, "chart"}`` (each run: :func:`train`'s figures).

    With no budget given: ``QUICK_STEPS`` steps of a tiny untrained model with a short warm-up when ``quick`` (a smoke
    run of the whole path, not a comparison), else ``DEFAULT_SECONDS`` (the documented figure's budget)."""
    recipes = dict(recipes or RECIPES)
    seeds = seeds if seeds is not None else [0]
    if steps is None and seconds is None:
        steps, seconds = (QUICK_STEPS, None) if quick else (None, DEFAULT_SECONDS)
    overrides = [*budget_overrides(steps, seconds), *(QUICK_OVERRIDES if quick else []), *overrides]
    check_same_recipe(recipes, overrides)
    results = {name: [train(name, recipe, seed, overrides, quick) for seed in seeds] for name, recipe in recipes.items()}
    budget = ", ".join(b for b in (f"{steps} steps" if steps else "", f"{seconds:g} s" if seconds else "") if b)
    chart = plot(results, Path(out), x, f"PPO vs GRPO on {Path(recipes['grpo']).stem} ({budget})")
    return {"quick": quick, "budget": {"steps": steps, "seconds": seconds}, "overrides": overrides, "runs": results, "chart": str(chart)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 3-step smoke run of a tiny model (not a comparison)")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (no time budget unless --seconds)")
    parser.add_argument("--seconds", type=float, default=None, help="time budget per run, warm-up included")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--x", choices=["time", "step"], default="time", help="the chart's x axis")
    parser.add_argument("--out", type=Path, default=Path("runs/ppo_vs_grpo.png"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to both recipes")
    args = parser.parse_args()
    result = run(args.quick, steps=args.steps, seconds=args.seconds, seeds=args.seeds, overrides=args.overrides, x=args.x,
                 out=args.out)
    table = Table("algorithm", "seed", "steps", "minutes", "s/step", "eval start", "eval end", "best (step)", "gain",
                  title=f"PPO vs GRPO ({', '.join(result['overrides'])})")
    for name, runs in result["runs"].items():
        for r in runs:
            table.add_row(name, str(r["seed"]), str(r["steps"]), f"{r['minutes']:.1f}", f"{r['seconds_per_step']:.2f}",
                          f"{r['eval_reward_start']:.3f}", f"{r['eval_reward_end']:.3f}",
                          f"{r['best_eval_reward']:.3f} ({r['best_step']})", f"{r['gain']:+.3f}")
    Console().print(table)
    Console().print(f"chart: {result['chart']}")


if __name__ == "__main__":
    main()
