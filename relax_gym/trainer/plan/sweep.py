"""A sweep of cluster configurations: inference replicas × max_staleness × stragglers mode, each one simulated run
(:func:`~.schedule.simulate`), against the colocate baseline on the same GPUs.

    result = sweep(costs, trainer, replicas=[2, 4, 6], staleness=[0, 1, 2], stragglers=["wait", "carry"])
    result.table()                 # markdown, one row per configuration (steady figures, whole-run ones in brackets)
    result.chart("sweep.png")      # steps/hour and steady data wait against replicas
    result.meeting(0.02)           # the configurations whose steady data wait is at most 2%

The actor gets the GPUs the replicas leave (``cluster.gpus - replicas * gpus_per_replica``) unless the costs fix
``cluster.actor_gpus``; a configuration that leaves it none is skipped. Every point uses the same seed, so the
same episodes (common random numbers): the differences between points are the schedule's, not the draws'.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import TrainerSection
from relax_gym.trainer.plan.costs import Costs
from relax_gym.trainer.plan.schedule import simulate

__all__ = ["TARGET_DATA_WAIT", "SweepResult", "point_row", "sweep"]

TARGET_DATA_WAIT = 0.02  # the target: the actor waits for data at most 2% of its step


def point_row(summary: dict[str, Any], colocate: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of one simulated configuration (a sweep row); ``colocate``: the baseline's summary (None: this
    is it). Speedups compare steady throughputs (a long run's), and whole runs as simulated."""
    hist = {int(k): v for k, v in summary["staleness_hist"].items()}
    consumed = sum(hist.values())
    discarded = summary.get("samples_discarded_stale", 0)
    base = colocate or summary
    return {
        "mode": summary["mode"], "replicas": summary["replicas"], "actor_gpus": summary["actor_gpus"],
        "max_staleness": summary["max_staleness"], "stragglers": summary["stragglers"],
        "steps_per_hour": summary["steps_per_hour_steady"], "steps_per_hour_run": summary["steps_per_hour"],
        "speedup": summary["steps_per_hour_steady"] / base["steps_per_hour_steady"],
        "speedup_run": summary["steps_per_hour"] / base["steps_per_hour"], "steps": summary["steps"],
        "data_wait": summary["data_wait_fraction"], "data_wait_steady": summary["data_wait_fraction_steady"],
        "staleness_mean": sum(k * v for k, v in hist.items()) / consumed if consumed else 0.0,
        "staleness_hist": summary["staleness_hist"], "samples_discarded": discarded,
        "discarded_share": discarded / (consumed + discarded) if consumed + discarded else 0.0,
        "engine_busy": summary["engine_busy_share"], "rollout_s": summary["rollout_s_mean"],
        "train_s": summary["train_s_mean"], "sync_s": summary["sync_s_mean"],
    }


@dataclass
class SweepResult:
    colocate: dict[str, Any]
    points: list[dict[str, Any]]
    inputs: dict[str, Any] = field(default_factory=dict)

    def meeting(self, target: float = TARGET_DATA_WAIT) -> list[dict[str, Any]]:
        return [p for p in self.points if p["data_wait_steady"] <= target]

    def best(self, target: float = TARGET_DATA_WAIT) -> dict[str, Any] | None:
        """The fastest configuration meeting the data-wait target (None: none does)."""
        ok = self.meeting(target)
        return max(ok, key=lambda p: p["steps_per_hour"]) if ok else None

    def table(self, target: float = TARGET_DATA_WAIT) -> str:
        head = ("| mode | replicas | actor GPUs | S | stragglers | steps/h steady (run) | x colocate steady (run) | "
                "data wait steady (run) | staleness mean | discarded | engine busy | ≤ target |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|")
        lines = [head]
        for p in [self.colocate, *self.points]:
            ok = "yes" if p["data_wait_steady"] <= target else ""
            lines.append(f"| {p['mode']} | {p['replicas']} | {p['actor_gpus']} | {p['max_staleness']} | {p['stragglers']} | "
                         f"{p['steps_per_hour']:.1f} ({p['steps_per_hour_run']:.1f}) | {p['speedup']:.2f} "
                         f"({p['speedup_run']:.2f}) | {100 * p['data_wait_steady']:.1f}% ({100 * p['data_wait']:.1f}%) | "
                         f"{p['staleness_mean']:.2f} | {p['samples_discarded']} | {100 * p['engine_busy']:.0f}% | {ok} |")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "colocate": self.colocate, "points": self.points,
                "target_data_wait": TARGET_DATA_WAIT, "best": self.best()}

    def write(self, out: str | Path) -> Path:
        """``sweep.json``, ``sweep.md`` and ``sweep.png`` in ``out``; returns the folder."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.json").write_text(json.dumps(self.to_json(), indent=2))
        (out / "sweep.md").write_text(self.table() + "\n")
        self.chart(out / "sweep.png")
        return out

    def chart(self, path: str | Path, target: float = TARGET_DATA_WAIT) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
        series: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for p in self.points:
            series.setdefault((p["max_staleness"], p["stragglers"]), []).append(p)
        for (s, mode), pts in sorted(series.items()):
            pts = sorted(pts, key=lambda p: p["replicas"])
            x = [p["replicas"] for p in pts]
            style = "-" if mode == "wait" else "--"
            line, = a.plot(x, [p["steps_per_hour"] for p in pts], style, marker="o", label=f"S={s} {mode}")
            b.plot(x, [max(100 * p["data_wait_steady"], 1e-3) for p in pts], style, marker="o", color=line.get_color())
            for p in pts:
                if p["data_wait_steady"] <= target:
                    a.plot(p["replicas"], p["steps_per_hour"], marker="*", markersize=14, color=line.get_color())
        a.axhline(self.colocate["steps_per_hour"], color="black", linewidth=1, label="colocate (all GPUs)")
        a.set(xlabel="inference replicas", ylabel="steps / hour, steady (simulated)", title="throughput (★: data wait ≤ 2%)")
        a.legend(fontsize=8)
        b.axhline(100 * target, color="red", linewidth=1, linestyle=":", label=f"target {100 * target:.0f}%")
        b.set(xlabel="inference replicas", ylabel="actor data wait, steady (%)", yscale="log", title="actor data wait")
        b.legend(fontsize=8)
        for ax in (a, b):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def sweep(costs: Costs, trainer: TrainerSection, *, replicas: list[int], staleness: list[int], stragglers: list[str],
          algorithm: dict[str, Any] | None = None, progress: Callable[[dict[str, Any]], None] | None = None) -> SweepResult:
    """Simulate colocate on every GPU, then async for each replicas × S × stragglers point that leaves the actor
    a GPU (see the module docstring)."""
    base = simulate(costs, trainer.model_copy(update={"mode": "colocate"}), algorithm=algorithm)
    colocate = point_row(base.summary, None)
    if progress:
        progress(colocate)
    points = []
    gpr = costs.generation.gpus_per_replica
    for r in replicas:
        c = costs.with_updates(cluster={"replicas": r})
        try:
            c.cluster.split("async", gpr)
        except ValueError:
            continue
        for s in staleness:
            for mode in stragglers:
                t = trainer.model_copy(update={"mode": "async", "max_staleness": s, "stragglers": mode})
                res = simulate(c, t, algorithm=algorithm)
                row = point_row(res.summary, base.summary)
                points.append(row)
                if progress:
                    progress(row)
    inputs = {"costs": costs.model_dump(mode="json"), "trainer": trainer.model_dump(mode="json"),
              "replicas": replicas, "staleness": staleness, "stragglers": stragglers}
    return SweepResult(colocate, points, inputs)
