"""Learning: run a recipe (default: the `make train` one) for several seeds and print held-out eval reward at the
start (after the format warm-up) and at the end, with the gain; then the embedded engine's tokens/s against plain
``model.generate`` on the same model and batch (ratio, same run).

    python benchmarks/learning.py [--recipe recipes/cpu-nextqa.yaml] [--seeds 0 1] [override ...]

Each seed is one full run (the recipe's time budget: 14 minutes on the 2-core reference machine). Run dirs go to
runs/bench-learning-seed<N>.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from relax_gym.trainer.colocate import ColocateTrainer
from relax_gym.trainer.config import load_recipe
from relax_gym.trainer.engines import bench as engine_bench


def _best(run_dir: Path) -> str:
    """The highest held-out eval reward the run reached, and at which step (for the curve's shape, not the bar)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["eval_reward"], r["step"]) for r in rows if "eval_reward" in r]
    reward, step = max(evals)
    return f"{reward:.3f} ({step})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/cpu-nextqa.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every seed")
    args = parser.parse_args()
    table = Table("seed", "steps", "minutes", "eval reward start", "eval reward end", "gain", "eval accuracy end",
                  "best eval reward (step)", title=f"learning: {args.recipe}")
    for seed in args.seeds:
        cfg = load_recipe(args.recipe, [*args.overrides, f"trainer.seed={seed}", f"model.seed={seed}"])
        trainer = ColocateTrainer(cfg, Path("runs") / f"bench-learning-seed{seed}")
        try:
            s = trainer.run()
        finally:
            trainer.close()
        table.add_row(str(seed), str(s["steps"]), f"{s['elapsed_s'] / 60:.1f}", f"{s['eval_reward_start']:.3f}",
                      f"{s['eval_reward_end']:.3f}", f"{s['eval_reward_end'] - s['eval_reward_start']:+.3f}",
                      f"{s['eval_accuracy_end']:.3f}", _best(Path("runs") / f"bench-learning-seed{seed}"))
    Console().print(table)
    tput = engine_bench.run()
    Console().print(tput)


if __name__ == "__main__":
    main()
