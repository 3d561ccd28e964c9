"""Soak: a long async run with random faults on the Docker backend, and whether anything drifts or leaks.

The workload is the tool-use recipe (``recipes/cpu-tool-use.yaml``: the policy writes python that runs in a sandbox)
in async mode with S = 1, sandboxes on Docker (``RELAX_GYM_SANDBOX=docker``; ``--backend bwrap`` to compare), a tiny
policy from random weights with a short SFT warm-up on the gold trajectories so that it calls tools from the start.
The reward weighs the answer and its format half and half (the recipe: 0.9 / 0.1): such a policy seldom computes
the number right, and the format part is what it can learn within the run, so the final eval reward says
something about learning under faults.
The faults, drawn per step from a seeded generator (so a rerun breaks the same steps):

- each non-actor role (env_worker, inference, reference, advantages) killed with probability ``p`` (Serve starts a
  new replica; level-1 recovery);
- engine errors with probability ``p`` (the engine raises on its next 2 generate calls: those episodes are masked);
- sandbox hangs with probability ``p`` (the next sandbox command sleeps until its own timeout ends it);
- the actor killed once, halfway (a global restart from the last checkpoint).

While the run goes, a monitor thread samples every 10 steps: resident memory (MiB), open file descriptors and
threads summed over this process and every Ray process on the machine (raylet, GCS, workers: ``ray::`` titles),
the containers of ours that exist (label ``relax-gym.sandbox``), and the Ray actors alive. Each series gets a
least-squares slope over the run's second half (per 100 steps); it is called flat when the fitted rise over that
half is under 5% of its mean (and under one unit for counts). Then a clean run of the same length (no faults)
gives the reference eval reward. Reported: samples produced / consumed / lost / duplicated, restarts by level,
faults by kind, the series and their slopes, final eval reward faulted vs clean, and the containers left after the
run (0 expected).

    python benchmarks/soak.py [--steps 200] [--p 0.02] [--backend docker|bwrap] [--no-clean] [--quick]

A 200-step soak takes about an hour per run on two cores; ``--quick`` is 20 steps, for checking the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from relax_gym.trainer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "cpu-tool-use.yaml"
OUT = Path("runs") / "bench-soak"
ROLES = ("env_worker", "inference", "reference", "advantages")
SAMPLE_EVERY = 10  # steps
CONTAINER_LABEL = "relax-gym.sandbox"


def fault_plan(steps: int, p: float) -> str:
    """The ``faults.inject`` override: random kills, engine errors and sandbox hangs, and one actor kill halfway
    (on an odd step, so the restart replays at least one step from the even-step checkpoint before it)."""
    actor_step = max(3, steps // 2 + (1 - (steps // 2) % 2))
    faults = [f"{{kind: kill, role: {role}, probability: {p}}}" for role in ROLES]
    faults += [f"{{kind: engine_error, probability: {p}, count: 2}}", f"{{kind: sandbox_hang, probability: {p}, count: 1}}",
               f"{{kind: kill, role: actor, at_step: {actor_step}}}"]
    return "faults.inject=[" + ", ".join(faults) + "]"


def workload(steps: int, backend: str) -> list[str]:
    return ["model.base=null", f"trainer.steps={steps}", "trainer.prompts_per_step=4", "trainer.group_size=2",
            "trainer.mode=async", "trainer.max_staleness=1", "algorithm.kl_coef=0.05", "trainer.sft_warmup_steps=30",
            "trainer.sft_batch_size=8", f"trainer.eval_every={max(10, steps // 4)}", "trainer.eval_episodes=32",
            # half the reward for the format (think, tool call, then an answer): a tiny policy from random weights
            # learns that within the run, while it rarely gets the number right, so the eval reward can move
            "env.kwargs.accuracy_weight=0.5", "env.kwargs.format_weight=0.5",
            "trainer.checkpoint_every=2", "trainer.time_budget_s=null", "inference.max_new_tokens=64",
            "metrics.tensorboard=false", "roles.bus=transferqueue", "roles.health_check_period_s=2", "faults.seed=0",
            # random kills all run long: each replacement is level 1 (the default budget, 3 per role, is for a run
            # whose roles die by accident: past it the run restarts globally)
            "roles.restart_budget=1000", "roles.max_global_restarts=3"]


# ---------------------------------------------------------------------------------------------- resources


def _ray_and_self() -> list[Any]:
    import psutil

    me = os.getpid()
    out = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] == me or cmd.startswith("ray::") or "raylet" in (proc.info["name"] or "") \
                or "gcs_server" in (proc.info["name"] or "") or "ray/_private/workers" in cmd:
            out.append(proc)
    return out


def our_containers() -> int | None:
    """Containers carrying our label (any state); None when no Docker engine answers."""
    try:
        done = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={CONTAINER_LABEL}"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len(done.stdout.split()) if done.returncode == 0 else None


def ray_actors_alive() -> int | None:
    """Ray actors alive, as the GCS lists them (the state API needs the dashboard, which runs here without)."""
    try:
        from ray._private import state

        return sum(1 for a in state.actors().values() if a.get("State") == "ALIVE")
    except Exception:  # noqa: BLE001 - the GCS may be unreachable for a moment; a gap in the series
        return None


def sample_resources() -> dict[str, float | None]:
    import psutil

    rss = fds = threads = 0
    for proc in _ray_and_self():
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                fds += proc.num_fds()
                threads += proc.num_threads()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return {"rss_mib": rss / 2**20, "open_fds": fds, "threads": threads, "containers": our_containers(),
            "ray_actors": ray_actors_alive()}


class Monitor(threading.Thread):
    """Samples the resources each time ``metrics.jsonl`` reaches a multiple of ``SAMPLE_EVERY`` steps."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True, name="soak-monitor")
        self.metrics = run_dir / "metrics.jsonl"
        self.samples: list[dict[str, Any]] = []
        self._done = threading.Event()

    def latest_step(self) -> int:
        try:
            lines = self.metrics.read_text().splitlines()
        except OSError:
            return 0
        steps = [json.loads(line)["step"] for line in lines[-5:] if line.strip().endswith("}")]
        return max(steps, default=0)

    def run(self) -> None:
        taken: set[int] = set()
        while not self._done.wait(2.0):
            step = self.latest_step()
            mark = step - step % SAMPLE_EVERY
            if mark >= SAMPLE_EVERY and mark not in taken:
                taken.add(mark)
                self.samples.append({"step": step, "t": time.time(), **sample_resources()})

    def stop(self) -> list[dict[str, Any]]:
        self._done.set()
        self.join(30)
        return self.samples


def slope(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Least-squares slope of ``key`` against the step over the second half of the run, per 100 steps."""
    points = [(s["step"], s[key]) for s in samples if s.get(key) is not None]
    half = points[len(points) // 2:] if len(points) >= 4 else points
    if len(half) < 2:
        return {"per_100_steps": None, "mean": None, "flat": None, "points": len(points)}
    xs, ys = [p[0] for p in half], [float(p[1]) for p in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    rise = b * (xs[-1] - xs[0])
    small = 1.0 if key in ("containers", "ray_actors", "threads", "open_fds") else 0.0
    flat = abs(rise) <= max(0.05 * abs(my), small)
    return {"per_100_steps": b * 100, "mean": my, "rise_second_half": rise, "flat": flat, "points": len(points)}


# ---------------------------------------------------------------------------------------------- runs


def run_once(overrides: list[str], run_dir: Path, monitor: bool) -> dict[str, Any]:
    from relax_gym.trainer.async_engine.controller import AsyncTrainer

    cfg = load_recipe(RECIPE, overrides)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    watcher = Monitor(run_dir) if monitor else None
    t0 = time.perf_counter()
    trainer = AsyncTrainer(cfg, run_dir)
    if watcher:
        watcher.start()
    try:
        summary = trainer.run()
    finally:
        trainer.close()
        samples = watcher.stop() if watcher else []
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["step"] >= 1]
    return {
        "wall_s": time.perf_counter() - t0, "steps": summary["steps"],
        **{k: summary[k] for k in ("samples_produced", "samples_consumed", "samples_lost", "samples_duplicated",
                                   "samples_regenerated", "restarts_level1", "restarts_level2", "faults_injected",
                                   "eval_reward_start", "eval_reward_end")},
        # the sampled reward of the last quarter's training episodes: many more episodes than the greedy eval's
        "train_reward_last_quarter": _mean([r["reward_mean"] for r in steps[-max(1, len(steps) // 4):] if "reward_mean" in r]),
        "masked": {k.removeprefix("status_"): sum(r.get(k, 0) for r in steps)
                   for k in sorted({k for r in steps for k in r if k.startswith("status_") and k != "status_ok"})},
        "samples": samples, "slopes": {k: slope(samples, k) for k in ("rss_mib", "open_fds", "threads", "containers",
                                                                       "ray_actors")},
        "run_dir": str(run_dir),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run(quick: bool = False, *, steps: int | None = None, p: float = 0.02, backend: str = "docker",
        clean: bool = True) -> dict[str, Any]:
    """The faulted soak, then (``clean``) the same run without faults; both on one Ray instance."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RELAX_GYM_SANDBOX"] = backend
    from relax_gym.trainer.async_engine.controller import ensure_ray

    steps = steps or (20 if quick else 200)
    if steps < 6:
        raise ValueError(f"a soak needs at least 6 steps (one actor kill halfway after a checkpoint); got {steps}")
    common = workload(steps, backend)
    out = OUT / ("quick" if quick else f"{backend}-{steps}")
    started = ensure_ray(load_recipe(RECIPE, common))
    try:
        faulted = run_once([*common, fault_plan(steps, p)], out / "faulted", monitor=True)
        reference = run_once(common, out / "clean", monitor=False) if clean else None
    finally:
        if started:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    left = our_containers()
    result = {"faulted": faulted, "clean": reference, "containers_after": left,
              "reward_gap": (faulted["eval_reward_end"] - reference["eval_reward_end"]) if reference else None,
              "workload": {"recipe": str(RECIPE), "steps": steps, "p": p, "backend": backend, "quick": quick,
                           "faults": fault_plan(steps, p).removeprefix("faults.inject=")}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 steps: checks the harness, not a soak")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--p", type=float, default=0.02, help="per-step probability of each random fault")
    parser.add_argument("--backend", choices=["docker", "bwrap"], default="docker")
    parser.add_argument("--no-clean", action="store_true", help="skip the clean reference run")
    args = parser.parse_args()
    result = run(args.quick, steps=args.steps, p=args.p, backend=args.backend, clean=not args.no_clean)
    f = result["faulted"]
    console = Console(width=200)
    head = Table("steps", "wall s", "produced", "consumed", "lost", "duplicated", "regenerated", "level-1 restarts",
                 "level-2", "faults", "masked", title=f"soak ({result['workload']['backend']}, p={result['workload']['p']})")
    head.add_row(str(f["steps"]), f"{f['wall_s']:.0f}", str(f["samples_produced"]), str(f["samples_consumed"]),
                 str(f["samples_lost"]), str(f["samples_duplicated"]), str(f["samples_regenerated"]),
                 json.dumps(f["restarts_level1"]), str(f["restarts_level2"]), json.dumps(f["faults_injected"]),
                 json.dumps(f["masked"]))
    console.print(head)
    series = Table("resource", "first", "last", "mean (2nd half)", "slope / 100 steps", "flat", title="resources every 10 steps")
    for key, s in f["slopes"].items():
        values = [x[key] for x in f["samples"] if x.get(key) is not None]
        series.add_row(key, f"{values[0]:.0f}" if values else "-", f"{values[-1]:.0f}" if values else "-",
                       f"{s['mean']:.1f}" if s["mean"] is not None else "-",
                       f"{s['per_100_steps']:+.2f}" if s["per_100_steps"] is not None else "-", str(s["flat"]))
    console.print(series)
    if result["clean"]:
        c = result["clean"]
        console.print(f"final eval reward: faulted {f['eval_reward_end']:.3f}, clean {c['eval_reward_end']:.3f} "
                      f"(gap {result['reward_gap']:+.3f}); training reward over the last quarter: faulted "
                      f"{f['train_reward_last_quarter']:.3f}, clean {c['train_reward_last_quarter']:.3f}")
    console.print(f"containers of ours after the run: {result['containers_after']}")


if __name__ == "__main__":
    main()
