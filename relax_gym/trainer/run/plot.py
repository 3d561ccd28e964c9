"""``relax-gym plot RUN_DIR``: reward and timing curves from ``metrics.jsonl`` to PNG (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from relax_gym.trainer.run.metrics import read_metrics  # noqa: E402
from relax_gym.trainer.run.step_row import eval_components  # noqa: E402

CURVES = {
    "reward.png": [("reward_mean", "train reward"), ("eval_reward", "eval reward (greedy)"), ("eval_accuracy", "eval accuracy")],
    "timing.png": [("time_rollout_s", "rollout"), ("time_train_s", "train"), ("time_sync_s", "weight sync"), ("time_step_s", "step")],
}


def plot_run(run_dir: str | Path) -> list[Path]:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    written = []
    for name, curves in CURVES.items():
        if name == "reward.png":  # and every other reward component the env reports (eval_<component>)
            named = {key for key, _ in curves}
            found = {k for r in rows for k in eval_components(r)} - named
            curves = [*curves, *((k, f"eval {k[len('eval_'):]}") for k in sorted(found))]
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for key, label in curves:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, label=label)
                drawn += 1
        ax.set_xlabel("step")
        ax.set_ylabel("reward" if name == "reward.png" else "seconds")
        ax.set_title(f"{run_dir.name}: {name[:-4]}")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend()
        out = run_dir / name
        fig.tight_layout()
        fig.savefig(out, dpi=100)
        plt.close(fig)
        written.append(out)
    return written
