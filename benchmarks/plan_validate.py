"""The planner (relax_gym/trainer/plan) against measured runs: calibrate on the colocate row, predict the async rows.

Two validations (issue "plan past this machine"):

1. **Ours** (``runs/bench-modes/full``, from ``benchmarks/modes.py``): ``relax-gym plan calibrate`` on the colocate
   run, then the async S=0, S=2 and S=2 carry runs predicted from those costs (their own trainer sections; the mean
   of ``--seeds`` simulated runs of the same length) against their measured steps/hour. Target: within ±15%.
2. **Relax's table** (arXiv 2604.11554; Qwen3-4B, DAPO-MATH-17k, 16 x H800): colocate 225.9 s/step (sleep/wake
   10 s/step), async on-policy 201.0 s, async off-policy 128.6 s. The paper gives the step times, not their parts,
   so the workload and the hardware split below are assumptions (every one printed, and written to the results).
   The actor's training time per step is not reported and decides the async rows, so it is swept
   (``--train-s``), and so is the response-length profile (``--lengths``): for each pair the engine speed is fitted
   to the colocate row, and the two async rows are predicted. A value for which both predictions land within ±15% is a consistent reading of the table, not a
   blind prediction.

    python benchmarks/plan_validate.py [--quick] [--seeds N] [--train-s 20,40,60,80] [--out runs/plan-validate/full]

Writes ``results.json``, ``results.md`` and ``validate.png`` in ``--out``; then, with the costs of the most
consistent reading of Relax's table, a sweep of replicas x max_staleness x stragglers on the 16 GPUs
(``sweep/``: table, chart, the costs YAML), naming the fastest configuration whose steady data wait is <= 2%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import TrainerSection
from relax_gym.trainer.plan.calibrate import (
    calibrate,
    fit_generation,
    load_run,
    measured_figures,
)
from relax_gym.trainer.plan.costs import (
    Cluster,
    Costs,
    Dist,
    EpisodeCost,
    GenerationCost,
    SyncCost,
    TrainCost,
)
from relax_gym.trainer.plan.schedule import simulate

OURS = Path("runs/bench-modes/full")
OUR_ASYNC = ["async-S0", "async-S2", "async-S2-carry"]
OUR_PUSH_S = 0.1  # DCS tcp push of the tiny policy (138 MiB) on a quiet machine: 0.099 s (docs/benchmarks.md)
TOLERANCE = 0.15

RELAX_MEASURED = {"colocate": 225.9, "async S=0 (on-policy)": 201.0, "async S=2 (off-policy)": 128.6}
RELAX_ASSUMPTIONS = {
    "workload": "32 prompts x 8 samples per step, single turn, no tools (Relax's scripts/training/text/"
                "run-qwen3-4B-16xgpu.sh: --rollout-batch-size 32 --n-samples-per-prompt 8, DAPO-Math-17k)",
    "response tokens": "lognormal, capped at 8192 (--rollout-max-response-len 8192), not reported: two profiles "
                       "swept, 'moderate tail' median 2500 sigma 0.5 (2% of answers reach the cap) and 'heavy tail' "
                       "median 4000 sigma 0.6 (12% reach it)",
    "prompt tokens": "200",
    "engines": "one GPU per SGLang engine (--rollout-num-gpus-per-engine 1): 16 in colocate, 8 in async; batch curve "
               "half_batch 64 (one sequence alone decodes at 1/65 of the saturated throughput); peak fitted",
    "actor": "all 16 GPUs in colocate, 8 in async (Relax's 8-GPU async script splits 4 + 4); training time linear in "
             "the GPU count; every sample forwarded (no zero-advantage skip); no reference forward (kl coef 0)",
    "train time": "per step on 16 GPUs, not reported: swept (--train-s)",
    "weight push": "async: 8 GB of bf16 at 4 GB/s effective plus 0 s fixed, engines paused throughout (SGLang's "
                   "update path); colocate: 3 s in-place reload",
    "sleep/wake": "10 s per colocate step (Relax's table)",
    "async modes": "on-policy = max_staleness 0; off-policy = max_staleness 2 (Relax's async script: --max-staleness "
                   "2); stragglers wait; streaming micro-batches of 32 rows",
}


LENGTHS = {"moderate tail": (2500.0, 0.5), "heavy tail": (4000.0, 0.6)}  # response tokens: lognormal median, sigma


def relax_costs(train_s_16: float, lengths: str = "moderate tail") -> Costs:
    median, sigma = LENGTHS[lengths]
    episode = EpisodeCost(completion_tokens=Dist(kind="lognormal", value=median, sigma=sigma, min=1.0, max=8192.0),
                          prompt_tokens=Dist.fixed(200.0), zero_adv_group_share=0.0)
    tokens_per_step = 256 * (200.0 + episode.completion_tokens.mean())
    return Costs(
        episode=episode,
        generation=GenerationCost(peak_tokens_per_s=10_000.0, half_batch=64.0, max_batch=512),
        train=TrainCost(s_per_token=train_s_16 / tokens_per_step, micro_batch_size=32, gpus=16, scaling=1.0),
        sync=SyncCost(push_s=0.0, weight_bytes=8e9, bandwidth_bytes_per_s=4e9, pause_s=None, sleep_wake_s=10.0,
                      colocate_push_s=3.0),
        cluster=Cluster(gpus=16, replicas=8),
    )


def steady_step_s(costs: Costs, trainer: TrainerSection, seeds: int) -> float:
    """Mean step time once the pipeline is full (the first S + 1 steps left out), over ``seeds`` runs."""
    skip = trainer.max_staleness + 1 if trainer.mode == "async" else 0
    means = []
    for seed in range(seeds):
        rows = simulate(costs, trainer.model_copy(update={"seed": seed})).rows[skip:]
        means.append(statistics.fmean(r["time_step_s"] for r in rows))
    return statistics.fmean(means)


def validate_relax(train_values: list[float], lengths: list[str], steps: int, seeds: int) -> list[dict[str, Any]]:
    base = TrainerSection(mode="colocate", steps=steps, prompts_per_step=32, group_size=8, concurrency=256)
    out = []
    for profile in lengths:
        for train_s in train_values:
            t0 = time.perf_counter()
            costs = relax_costs(train_s, profile)
            peak, fitted = fit_generation(costs, base, RELAX_MEASURED["colocate"], key="time_step_s", lo=100.0,
                                          hi=1e6, rtol=0.003)
            costs = costs.with_updates(generation={"peak_tokens_per_s": peak})
            colocate = simulate(costs, base)
            pred = {"colocate": fitted}
            for name, s in (("async S=0 (on-policy)", 0), ("async S=2 (off-policy)", 2)):
                pred[name] = steady_step_s(costs, base.model_copy(update={"mode": "async", "max_staleness": s,
                                                                          "steps": steps + s}), seeds)
            errors = {k: pred[k] / RELAX_MEASURED[k] - 1.0 for k in pred}
            out.append({"lengths": profile, "train_s_16": train_s, "peak_tokens_per_s": peak, "predicted_s": pred,
                        "error": errors, "within": all(abs(e) <= TOLERANCE for e in errors.values()),
                        "colocate_rollout_s": colocate.summary["rollout_s_mean"],
                        "colocate_train_s": colocate.summary["train_s_mean"], "costs": costs.model_dump(mode="json"),
                        "wall_s": time.perf_counter() - t0})
            print(f"relax {profile}, train {train_s:.0f} s: peak {peak:.0f} tok/s, " + ", ".join(
                f"{k} {pred[k]:.1f} s ({100 * errors[k]:+.1f}%)" for k in pred), flush=True)
    return out


def sweep_relax(costs: Costs, steps: int, out: Path) -> dict[str, Any]:
    """The documented sweep: replicas x S x stragglers on the 16 GPUs, from costs consistent with Relax's table."""
    from relax_gym.trainer.plan.sweep import sweep

    trainer = TrainerSection(steps=steps, prompts_per_step=32, group_size=8, concurrency=256)
    result = sweep(costs, trainer, replicas=[4, 6, 8, 10], staleness=[1, 2, 4], stragglers=["wait", "carry"],
                   progress=lambda p: print(f"  sweep {p['mode']} replicas={p['replicas']} S={p['max_staleness']} "
                                            f"{p['stragglers']}: {p['steps_per_hour']:.1f} steps/h steady, "
                                            f"x{p['speedup']:.2f}, data wait {100 * p['data_wait_steady']:.1f}%",
                                            flush=True))
    result.write(out)
    costs.to_yaml(out / "costs.yaml")
    return result.to_json()


def validate_ours(seeds: int, push_s: float, ours: Path = OURS) -> dict[str, Any] | None:
    if not (ours / "colocate" / "metrics.jsonl").is_file():
        print(f"{ours}/colocate: no run (benchmarks/modes.py makes it); ours skipped")
        return None
    fit = calibrate(ours / "colocate", push_s=push_s)
    rows = []
    for name in ["colocate", *OUR_ASYNC]:
        run = load_run(ours / name)
        measured = measured_figures(run)
        sph = [simulate(fit.costs, run.trainer.model_copy(update={"seed": s})).summary for s in range(seeds)]
        pred = {k: statistics.fmean(x[k] for x in sph) for k in ("steps_per_hour", "data_wait_fraction",
                                                                   "rollout_s_mean", "train_s_mean", "sync_s_mean")}
        pred["samples_discarded_stale"] = statistics.fmean(x["samples_discarded_stale"] for x in sph)
        error = pred["steps_per_hour"] / measured["steps_per_hour"] - 1.0
        rows.append({"mode": name, "measured": measured, "predicted": pred, "error": error,
                     "within": abs(error) <= TOLERANCE,
                     "measured_discarded": run.summary.get("samples_discarded_stale", 0)})
        print(f"ours {name}: predicted {pred['steps_per_hour']:.0f} steps/h, measured {measured['steps_per_hour']:.0f} "
              f"({100 * error:+.1f}%)", flush=True)
    return {"calibration": fit.report, "costs": fit.costs.model_dump(mode="json"), "rows": rows}


def chart(ours: dict[str, Any] | None, relax: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3))
    a, b = axes
    if ours is not None:
        names = [r["mode"] for r in ours["rows"]]
        x = range(len(names))
        a.bar([i - 0.2 for i in x], [r["measured"]["steps_per_hour"] for r in ours["rows"]], 0.4, label="measured")
        a.bar([i + 0.2 for i in x], [r["predicted"]["steps_per_hour"] for r in ours["rows"]], 0.4, label="predicted")
        for i, r in enumerate(ours["rows"]):
            a.annotate(f"{100 * r['error']:+.0f}%", (i + 0.2, r["predicted"]["steps_per_hour"]), ha="center",
                       va="bottom", fontsize=8)
        a.set_xticks(list(x), names, fontsize=8)
        a.set(ylabel="steps / hour", title="ours (2 CPU cores): calibrated on colocate")
        a.legend(fontsize=8)
    names = list(RELAX_MEASURED)
    x = list(range(len(names)))
    b.bar(x, [RELAX_MEASURED[n] for n in names], 0.6, color="lightgray", label="Relax (measured)")
    for r in relax:
        b.plot(x, [r["predicted_s"][n] for n in names], marker="o" if r["within"] else ".",
               linestyle="-" if r["lengths"] == "moderate tail" else "--",
               label=f"{r['lengths']}, train {r['train_s_16']:.0f} s" + (" (all ±15%)" if r["within"] else ""))
    b.set_xticks(x, names, fontsize=8)
    b.set(ylabel="seconds / step", title="Relax, Qwen3-4B, 16 x H800: calibrated on colocate")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(ours: dict[str, Any] | None, relax: list[dict[str, Any]]) -> str:
    lines = []
    if ours is not None:
        lines += ["Ours (calibrated on runs/bench-modes/full/colocate):", "",
                  "| mode | measured steps/h | predicted steps/h | error | data wait measured / predicted | discarded measured / predicted |",
                  "|---|---|---|---|---|---|"]
        for r in ours["rows"]:
            m, p = r["measured"], r["predicted"]
            lines.append(f"| {r['mode']} | {m['steps_per_hour']:.0f} | {p['steps_per_hour']:.0f} | {100 * r['error']:+.1f}% | "
                         f"{100 * m['data_wait_fraction']:.0f}% / {100 * p['data_wait_fraction']:.0f}% | "
                         f"{r['measured_discarded']} / {p['samples_discarded_stale']:.0f} |")
        lines.append("")
    lines += ["Relax's table (calibrated on the colocate row; s/step):", "",
              "| response lengths (assumed) | train s/step on 16 GPUs (assumed) | fitted peak tok/s | colocate rollout s | colocate 225.9 | on-policy 201.0 | off-policy 128.6 | all within ±15% |",
              "|---|---|---|---|---|---|---|---|"]
    for r in relax:
        p, e = r["predicted_s"], r["error"]
        cells = [f"{p[k]:.1f} ({100 * e[k]:+.1f}%)" for k in RELAX_MEASURED]
        lines.append(f"| {r['lengths']} | {r['train_s_16']:.0f} | {r['peak_tokens_per_s']:.0f} | {r['colocate_rollout_s']:.0f} | "
                     + " | ".join(cells) + f" | {'yes' if r['within'] else 'no'} |")
    lines += ["", "Assumptions (Relax):", ""] + [f"- {k}: {v}" for k, v in RELAX_ASSUMPTIONS.items()]
    return "\n".join(lines) + "\n"


def validate(*, quick: bool = False, seeds: int | None = None, train_s: str | None = None,
             lengths: str = ",".join(LENGTHS), push_s: float = OUR_PUSH_S, skip_ours: bool = False,
             skip_sweep: bool = False, sweep_steps: int | None = None, out: Path | None = None,
             ours_dir: Path = OURS) -> dict[str, Any]:
    """Both validations and the sweep; writes ``out`` (default runs/plan-validate/full or quick); returns what
    results.json holds."""
    out = out or Path("runs/plan-validate") / ("quick" if quick else "full")
    seeds = seeds or (1 if quick else 3)
    steps = 8 if quick else 16
    train_values = [float(x) for x in (train_s or ("30,60" if quick else "20,40,60,80")).split(",")]
    profiles = [x.strip() for x in lengths.split(",") if x.strip()]
    start = time.perf_counter()
    ours = None if skip_ours else validate_ours(seeds, push_s, ours_dir)
    relax = validate_relax(train_values, profiles, steps, seeds)
    out.mkdir(parents=True, exist_ok=True)
    swept = None
    consistent = [r for r in relax if r["within"]]
    if consistent and not skip_sweep:  # the most consistent reading: smallest worst error
        best = min(consistent, key=lambda r: max(abs(e) for e in r["error"].values()))
        print(f"sweep with the costs of: {best['lengths']}, train {best['train_s_16']:.0f} s", flush=True)
        swept = sweep_relax(Costs.model_validate(best["costs"]), sweep_steps or (10 if quick else 24), out / "sweep")
    results = {"ours": ours, "relax": relax, "relax_measured": RELAX_MEASURED, "relax_assumptions": RELAX_ASSUMPTIONS,
               "seeds": seeds, "steps": steps, "tolerance": TOLERANCE, "sweep": swept}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    text = markdown(ours, relax)
    if swept is not None:
        best = swept["best"]
        text += ("\nSweep (16 GPUs, costs of the most consistent reading; sweep/sweep.md, sweep/sweep.png, "
                 "sweep/costs.yaml): " + (f"fastest with a steady data wait <= 2%: {best['replicas']} replicas, actor on "
                                          f"{best['actor_gpus']} GPUs, S={best['max_staleness']} {best['stragglers']}: "
                                          f"{best['steps_per_hour']:.1f} steps/h steady, {best['speedup']:.2f}x colocate, data "
                                          f"wait {100 * best['data_wait_steady']:.2f}%" if best else "no configuration "
                                          "reaches a data wait <= 2%") + "\n")
    (out / "results.md").write_text(text)
    chart(ours, relax, out / "validate.png")
    print(text)
    print(f"written: {out}/results.json, results.md, validate.png ({time.perf_counter() - start:.0f} s)")
    return results


def run(quick: bool = False) -> dict[str, Any]:
    """``relax-gym bench plan_validate``: the figures of :func:`validate` (prediction errors in %, the sweep's best)."""
    res = validate(quick=quick)
    figures: dict[str, Any] = {}
    for r in (res["ours"] or {}).get("rows", []):
        figures[f"ours {r['mode']}: predicted / measured steps/h - 1 (%)"] = round(100 * r["error"], 1)
    for r in res["relax"]:
        if r["within"]:
            for k, e in r["error"].items():
                figures[f"relax {k} ({r['lengths']}, train {r['train_s_16']:.0f} s): error (%)"] = round(100 * e, 1)
    figures["relax readings within ±15%"] = sum(r["within"] for r in res["relax"])
    best = (res["sweep"] or {}).get("best")
    if best:
        figures["sweep best: x colocate (steady)"] = round(best["speedup"], 2)
        figures["sweep best: data wait (steady, %)"] = round(100 * best["data_wait_steady"], 2)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and seeds, two train-time values")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--train-s", default=None, help="comma-separated train seconds per step on 16 GPUs (Relax)")
    ap.add_argument("--lengths", default=",".join(LENGTHS), help=f"response-length profiles (Relax): {list(LENGTHS)}")
    ap.add_argument("--skip-sweep", action="store_true", help="no replicas x S x stragglers sweep after the check")
    ap.add_argument("--sweep-steps", type=int, default=None, help="steps per sweep point (default 24; --quick 10)")
    ap.add_argument("--push-s", type=float, default=OUR_PUSH_S, help="ours: an async push's seconds (not in colocate)")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--ours", type=Path, default=OURS, help="the modes benchmark's run dirs (colocate, async-*)")
    ap.add_argument("--out", type=Path, default=None, help="default: runs/plan-validate/full (or quick)")
    args = ap.parse_args()
    validate(quick=args.quick, seeds=args.seeds, train_s=args.train_s, lengths=args.lengths, push_s=args.push_s,
             skip_ours=args.skip_ours, skip_sweep=args.skip_sweep, sweep_steps=args.sweep_steps, out=args.out,
             ours_dir=args.ours)


if __name__ == "__main__":
    main()
