"""Faults and recovery: the same async run with and without injected faults, and what the faults cost.

The workload is the default recipe in async mode (nextqa-video, tiny policy, S = 1, a KL term so that the reference
role is deployed, checkpoints every 2 steps) run twice on one Ray instance: once clean, once with a ``faults:``
section that kills one replica of every non-actor role (env_worker, inference, advantages, reference; one role per
step), makes the engine raise on a few generate calls, and kills the actor once (a global restart from the last
checkpoint). Reported: the faults injected, restarts by level (level 1 by role), samples produced / consumed / lost /
duplicated (by sample id; "regenerated" are samples made after a checkpoint and thrown away by the global restart,
then made again under the same ids), episodes masked by the engine errors, steps completed, and the wall time of
the faulted run over the clean one (one run, same machine, same config but ``faults:``).

    python benchmarks/faults.py [--quick] [--steps N]

The sandbox_hang fault needs a tool env in a sandbox; its check is ``tests/sandbox/test_injected_hang.py`` (a hung
command ends at its timeout), not this workload.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from relax_gym.trainer.config import load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "cpu-nextqa.yaml"
OUT = Path("runs") / "bench-faults"
ROLES = ("env_worker", "inference", "advantages", "reference")


def fault_plan(steps: int) -> str:
    """Every non-actor role killed once (steps 1-4), engine errors at step 2, the actor killed at the last step but
    one (after a checkpoint at an even step, so the restart replays at least one step)."""
    kills = [f"{{kind: kill, role: {role}, at_step: {i + 1}}}" for i, role in enumerate(ROLES)]
    return ("faults.inject=[" + ", ".join([*kills, "{kind: engine_error, at_step: 2, count: 3}",
                                           f"{{kind: kill, role: actor, at_step: {steps - 1}}}"]) + "]")


def run_once(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from relax_gym.trainer.async_engine.controller import AsyncTrainer

    cfg = load_recipe(RECIPE, overrides)
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl appends: a rerun must not mix with an old run
    t0 = time.perf_counter()
    trainer = AsyncTrainer(cfg, run_dir)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    return {
        "wall_s": wall, "steps": summary["steps"], "step_rows": len(steps),
        "samples_produced": summary["samples_produced"], "samples_consumed": summary["samples_consumed"],
        "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
        "samples_regenerated": summary["samples_regenerated"],
        "masked_engine_error": sum(r.get("status_engine_error", 0) for r in steps),
        "masked_env_error": sum(r.get("status_env_error", 0) for r in steps),
        "restarts_level1": summary["restarts_level1"], "restarts_level2": summary["restarts_level2"],
        "restarted_from_steps": summary["restarted_from_steps"], "faults_injected": summary["faults_injected"],
        "eval_reward_end": summary["eval_reward_end"], "run_dir": str(run_dir),
    }


def run(quick: bool = False, *, steps: int | None = None) -> dict[str, Any]:
    """Clean run, then the faulted run, on one Ray instance; returns both and the wall-time ratio."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from relax_gym.trainer.async_engine.controller import ensure_ray

    steps = steps or (6 if quick else 12)
    if steps < 6:
        raise ValueError(f"the fault plan needs at least 6 steps (kills at steps 1-4, the actor at step {steps - 1}); got {steps}")
    p, g = (2, 2) if quick else (4, 4)
    # from a random policy, as its figures always were (recovery, not learning; and no 5-minute base build)
    common = ["model.base=null", f"trainer.steps={steps}", f"trainer.prompts_per_step={p}", f"trainer.group_size={g}", "trainer.mode=async",
              "trainer.max_staleness=1", "algorithm.kl_coef=0.05", "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=4",
              f"trainer.eval_every={steps}", "trainer.eval_episodes=4", "trainer.checkpoint_every=2",
              "trainer.time_budget_s=null", "inference.max_new_tokens=8", "metrics.tensorboard=false",
              "roles.bus=transferqueue", "roles.health_check_period_s=2"]
    out = OUT / ("quick" if quick else "full")
    started = ensure_ray(load_recipe(RECIPE, common))
    try:
        clean = run_once(common, out / "clean")
        faulted = run_once([*common, fault_plan(steps)], out / "faulted")
    finally:
        if started:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    return {"clean": clean, "faulted": faulted, "wall_ratio": faulted["wall_s"] / clean["wall_s"],
            "workload": {"recipe": str(RECIPE), "steps": steps, "prompts_per_step": p, "group_size": g, "quick": quick,
                         "faults": fault_plan(steps).removeprefix("faults.inject=")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="6 steps of 2 prompts x 2 samples")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    result = run(args.quick, steps=args.steps)
    table = Table("run", "steps", "wall s", "produced", "consumed", "lost", "duplicated", "regenerated", "masked (engine)",
                  "level-1 restarts", "level-2", "faults", title=f"faults and recovery ({result['workload']['steps']} steps)")
    for name in ("clean", "faulted"):
        r = result[name]
        table.add_row(name, str(r["steps"]), f"{r['wall_s']:.0f}", str(r["samples_produced"]), str(r["samples_consumed"]),
                      str(r["samples_lost"]), str(r["samples_duplicated"]), str(r["samples_regenerated"]),
                      str(r["masked_engine_error"]), json.dumps(r["restarts_level1"]), str(r["restarts_level2"]),
                      json.dumps(r["faults_injected"]))
    console = Console(width=200)
    console.print(table)
    console.print(f"wall time, faulted / clean: {result['wall_ratio']:.2f}x")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "last.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
