"""``relax-gym plan``: the async scheduler on a virtual clock, for clusters this machine is not.

    relax-gym plan calibrate RUN_DIR --out costs.yaml          # fit cost models from a finished run
    relax-gym plan run RECIPE --costs costs.yaml [overrides]    # one simulated run: figures and an event log
    relax-gym plan sweep RECIPE --costs costs.yaml --gpus 16 --model-size 4B --replicas 4,6,8 --out DIR

Only typer is imported here; the planner loads when a command runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["parse_model_size", "plan_app"]

plan_app = typer.Typer(help="Plan past this machine: the real async scheduling code on a virtual clock, with simulated "
                            "roles timed by cost models (relax_gym/trainer/plan).", no_args_is_help=True)

Recipe = Annotated[Path | None, typer.Argument(help="YAML recipe: its trainer section (prompts, group size, steps, mode, S)")]
Overrides = Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. trainer.steps=30", show_default=False)]
CostsOpt = Annotated[Path, typer.Option("--costs", help="cost figures (YAML of relax_gym.trainer.plan.costs.Costs; "
                                                        "`plan calibrate` writes one)")]


def parse_model_size(text: str) -> float:
    """``"4B"`` -> 4e9 parameters (``K``, ``M``, ``B``/``G``, ``T`` suffixes; a plain number is a count)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if m is None:
        raise typer.BadParameter(f"{text!r}: a parameter count such as 4B, 500M or 7e9")
    scale = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _load(recipe: Path | None, overrides: list[str] | None, costs: Path) -> tuple[Any, Any]:
    from relax_gym.trainer.config import ConfigError, load_recipe
    from relax_gym.trainer.plan.costs import Costs

    overrides = list(overrides or [])
    if recipe is not None and "=" in recipe.name and not recipe.exists():  # no recipe: the first override landed here
        overrides.insert(0, str(recipe))
        recipe = None
    try:
        cfg = load_recipe(recipe, overrides)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        figures = Costs.from_yaml(costs)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{costs}: {exc}") from None
    return cfg, figures


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


@plan_app.command("run", context_settings={"allow_extra_args": True})
def run_cmd(costs: CostsOpt, recipe: Recipe = None, overrides: Overrides = None,
            log: Annotated[Path | None, typer.Option(help="write the event log (JSON lines) here")] = None,
            as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False) -> None:
    """Simulate one run of the recipe (its trainer.mode, max_staleness, stragglers) and print its figures."""
    from relax_gym.trainer.plan.schedule import simulate

    cfg, figures = _load(recipe, overrides, costs)
    res = simulate(figures, cfg.trainer, algorithm=cfg.algorithm.model_dump(mode="json"))
    if log is not None:
        res.log.write(log)
    s = res.summary
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    typer.echo(f"{s['mode']} S={s['max_staleness']} stragglers={s['stragglers']}: {s['replicas']} replica(s), "
               f"actor on {s['actor_gpus']} GPU(s), {s['steps']} steps in {s['loop_s']:.1f} s simulated")
    typer.echo(f"  steps/hour {s['steps_per_hour']:.1f} ({s['steps_per_hour_steady']:.1f} once the pipeline is full), "
               f"step {s['step_s_mean']:.2f} s (rollout {s['rollout_s_mean']:.2f}, "
               f"train {s['train_s_mean']:.2f}, sync {s['sync_s_mean']:.3f})")
    typer.echo(f"  actor data wait {_pct(s['data_wait_fraction'])} (steady {_pct(s['data_wait_fraction_steady'])}), "
               f"engines busy {_pct(s['engine_busy_share'])}")
    typer.echo(f"  staleness {s['staleness_hist']}, samples discarded {s['samples_discarded_stale']}, "
               f"lost {s['samples_lost']}")
    typer.echo(f"  event log: {s['events']} events, sha256 {s['log_digest'][:16]}" + (f" -> {log}" if log else ""))


@plan_app.command("sweep", context_settings={"allow_extra_args": True})
def sweep_cmd(costs: CostsOpt, recipe: Recipe = None, overrides: Overrides = None,
              gpus: Annotated[int | None, typer.Option(help="GPUs in all (default: the costs' cluster.gpus)")] = None,
              model_size: Annotated[str | None, typer.Option(help="parameters, e.g. 4B: sets the pushed weight bytes "
                                                                  "(bf16) only; speeds come from the costs")] = None,
              replicas: Annotated[str, typer.Option(help="inference replicas to try, comma-separated")] = "1,2,4",
              staleness: Annotated[str, typer.Option(help="max_staleness values, comma-separated")] = "0,1,2",
              stragglers: Annotated[str, typer.Option(help="stragglers modes, comma-separated")] = "wait,carry",
              out: Annotated[Path, typer.Option(help="folder for sweep.json, sweep.md, sweep.png")] = Path("runs/plan-sweep"),
              ) -> None:
    """Simulate colocate on every GPU and async for each replicas x S x stragglers point; print the table, mark the
    configurations whose steady actor data wait is at most 2%, write JSON, markdown and a chart."""
    from relax_gym.trainer.plan.sweep import TARGET_DATA_WAIT, sweep

    cfg, figures = _load(recipe, overrides, costs)
    update: dict[str, dict[str, Any]] = {}
    if gpus is not None:
        update["cluster"] = {"gpus": gpus}
    if model_size is not None:
        update["sync"] = {"weight_bytes": 2.0 * parse_model_size(model_size)}
    if update:
        figures = figures.with_updates(**update)
    modes = [m.strip() for m in stragglers.split(",") if m.strip()]
    if not set(modes) <= {"wait", "carry"}:
        raise typer.BadParameter(f"--stragglers takes wait and/or carry, got {stragglers!r}")
    result = sweep(figures, cfg.trainer, replicas=_ints(replicas), staleness=_ints(staleness), stragglers=modes,
                   algorithm=cfg.algorithm.model_dump(mode="json"),
                   progress=lambda p: typer.echo(f"  {p['mode']} replicas={p['replicas']} S={p['max_staleness']} "
                                                 f"{p['stragglers']}: {p['steps_per_hour']:.1f} steps/h steady, data wait "
                                                 f"{_pct(p['data_wait_steady'])}", err=True))
    result.write(out)
    typer.echo(result.table())
    best = result.best()
    if best is None:
        typer.echo(f"no configuration reaches a steady data wait <= {_pct(TARGET_DATA_WAIT)}")
    else:
        typer.echo(f"fastest with data wait <= {_pct(TARGET_DATA_WAIT)}: {best['replicas']} replicas, actor on "
                   f"{best['actor_gpus']} GPU(s), S={best['max_staleness']} {best['stragglers']}: "
                   f"{best['steps_per_hour']:.1f} steps/h steady ({best['speedup']:.2f}x colocate)")
    typer.echo(f"written: {out}/sweep.json, sweep.md, sweep.png")


@plan_app.command("calibrate")
def calibrate_cmd(run_dir: Annotated[Path, typer.Argument(help="a finished run (config.json, metrics.jsonl, rollouts/)")],
                  out: Annotated[Path | None, typer.Option(help="write the fitted costs here (YAML)")] = None,
                  half_batch: Annotated[float, typer.Option(help="assumed engine batch-size curve (sequences at half "
                                                                 "peak throughput)")] = 4.0,
                  push_s: Annotated[float | None, typer.Option(help="an async push's seconds, when the run is colocate")] = None,
                  ) -> None:
    """Fit the cost models from a run's metrics and rollout records; print what was fitted, given, assumed, missing."""
    from relax_gym.trainer.plan.calibrate import calibrate

    try:
        fit = calibrate(run_dir, half_batch=half_batch, push_s=push_s)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{run_dir}: {exc}") from None
    r = fit.report
    typer.echo(f"{r['run']}: {r['mode']}, {r['steps']} steps")
    for title in ("fitted", "given", "assumed"):
        for key, text in r[title].items():
            typer.echo(f"  {title:8s} {key}: {text}")
    for text in r["missing"]:
        typer.echo(f"  missing  {text}")
    if out is not None:
        fit.costs.to_yaml(out)
        typer.echo(f"written: {out}")
