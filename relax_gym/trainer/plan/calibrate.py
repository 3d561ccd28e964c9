"""Fit the planner's cost models from a finished run (``relax-gym plan calibrate RUN_DIR``).

    fit = calibrate("runs/bench-modes/full/colocate")
    fit.costs.to_yaml("costs.yaml"); fit.report["missing"]; fit.report["check"]

What a run directory gives, and what each figure becomes (``fit.report`` says which is which):

- ``config.json``: the trainer section (prompts, group size, mode, S, concurrency) the checks re-simulate; the
  env's ``tool_latency`` (the tool-use envs' simulated wait; **given**, not fitted); ``inference.max_new_tokens``
  and ``max_batch``; ``actor.micro_batch_size``; the inference replica count.
- ``rollouts/step_*.jsonl`` (the train episodes' records): each episode's turns, completion tokens, other tokens
  (prompt and tool results) and the tool calls that waited (parsed ones) become ``episode.empirical`` (resampled
  whole); they give the mean tokens of an episode the actor forwards. Their ``timing`` (runs since episodes record
  it): the env resets become ``episode.reset_s`` (resampled); engine-call and env-step times are reported
  (``report["episode_timing"]``).
- ``metrics.jsonl``: ``zero_adv_group_share`` (groups whose rewards are all equal: no gradient);
  ``time_train_s`` against the step's forwarded tokens (``samples_forwarded`` x that mean), by least squares:
  ``train.step_overhead_s + train.s_per_token * tokens`` (**fitted**); ``time_sync_s``: the push (median;
  colocate: ``sync.colocate_push_s``, async: ``sync.push_s``); ``time_rollout_s`` (colocate) or ``time_step_s``
  (async): the generation speed ``generation.peak_tokens_per_s`` is the one that makes the simulated run match its
  mean (bisection on the simulator itself, every other figure fixed; **fitted**).

Not in a run, hence **assumed** (an argument) or **missing** (listed): the engine's batch-size curve
(``half_batch``), the time a tool call spends in the sandbox beyond the simulated latency and the env's own step
time (absorbed into the generation fit), the push's engine pause (the embedded engine
stages the buckets and stops ~0.01 s), an async push's duration when calibrating on colocate, the reference role's
forward (a colocate step's train time includes it), and contention between roles sharing CPU cores.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import TrainerSection
from relax_gym.trainer.plan.costs import (
    Cluster,
    Costs,
    Dist,
    EpisodeCost,
    GenerationCost,
    SyncCost,
    TrainCost,
)

__all__ = ["Calibration", "RunData", "calibrate", "fit_generation", "load_run"]

STAGED_PAUSE_S = 0.011  # the embedded engine's pause per push with staged buckets (docs/benchmarks.md, weight sync)


@dataclass
class RunData:
    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]  # the metrics rows of training steps
    episodes: dict[int, list[dict[str, Any]]]  # step -> its train episodes' records
    summary: dict[str, Any]

    @property
    def trainer(self) -> TrainerSection:
        keep = {k: v for k, v in self.config.get("trainer", {}).items() if k in TrainerSection.model_fields}
        return TrainerSection.model_validate(keep)


@dataclass
class Calibration:
    costs: Costs
    report: dict[str, Any]


def load_run(run_dir: str | Path) -> RunData:
    run = Path(run_dir)
    config = json.loads((run / "config.json").read_text())
    rows = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        rows = [r for r in (json.loads(x) for x in metrics.read_text().splitlines() if x.strip())
                if r.get("step", 0) >= 1 and "time_train_s" in r]
    episodes: dict[int, list[dict[str, Any]]] = {}
    for f in sorted((run / "rollouts").glob("step_*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("kind") == "train":
                    episodes.setdefault(int(r["step"]), []).append(r)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    return RunData(run, config, rows, episodes, summary)


def tool_waits(record: dict[str, Any]) -> int:
    """Tool calls of a recorded episode that waited: the parsed ones (a malformed call is answered at once, with no
    latency); without its messages, every call counts."""
    parts = [p for m in record.get("messages") or [] for p in m.get("parts", []) if p.get("type") == "tool_call"]
    if parts:
        return sum(1 for p in parts if "error" not in p)
    return int(record.get("tool_calls", 0))


def _forwarded_tokens(episodes: list[dict[str, Any]]) -> int:
    """Tokens of the episodes the actor forwards: trainable, in a group whose rewards are not all equal."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for e in episodes:
        groups.setdefault(e.get("group"), []).append(e)
    total = 0
    for members in groups.values():
        ok = [e for e in members if e.get("trainable", True)]
        if len({float(e["reward"]) for e in ok}) > 1:
            total += sum(int(e.get("prompt_tokens", 0)) + int(e.get("completion_tokens", 0)) for e in ok)
    return total


def _zero_adv_share(episodes: dict[int, list[dict[str, Any]]]) -> float | None:
    flags = []
    for eps in episodes.values():
        groups: dict[Any, set[float]] = {}
        for e in eps:
            groups.setdefault(e.get("group"), set()).add(float(e["reward"]))
        flags += [len(r) <= 1 for r in groups.values()]
    return sum(flags) / len(flags) if flags else None


def _linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` with a, b >= 0 (falls back to a ratio through the origin)."""
    if len(xs) >= 3 and statistics.pvariance(xs) > 0:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        a = my - b * mx
        if a >= 0 and b > 0:
            return a, b
    return 0.0, (sum(ys) / sum(xs) if sum(xs) > 0 else 0.0)


def fit_generation(costs: Costs, trainer: TrainerSection, target_s: float, *, key: str, steps: int | None = None,
                   lo: float = 1.0, hi: float = 1e7, rtol: float = 1e-3, iterations: int = 40) -> tuple[float, float]:
    """The ``peak_tokens_per_s`` whose simulated run has mean ``key`` (``time_rollout_s`` or ``time_step_s``)
    equal to ``target_s``: bisection in log space until ``hi / lo < 1 + rtol`` (the simulated time falls as the
    engine gets faster). Returns (peak, simulated mean)."""
    from relax_gym.trainer.plan.schedule import simulate

    t = trainer.model_copy(update={"steps": steps}) if steps else trainer

    def mean_s(peak: float) -> float:
        c = costs.with_updates(generation={"peak_tokens_per_s": peak})
        rows = simulate(c, t).rows
        return sum(r[key] for r in rows) / len(rows)

    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if mean_s(mid) > target_s:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + rtol:
            break
    peak = math.sqrt(lo * hi)
    return peak, mean_s(peak)


def calibrate(run_dir: str | Path, *, half_batch: float = 4.0, pause_s: float | None = STAGED_PAUSE_S,
              push_s: float | None = None) -> Calibration:
    """Fit :class:`~.costs.Costs` to a run (see the module docstring). ``half_batch``: the engine's batch-size
    curve (assumed); ``pause_s``: the engines' stop per push (assumed; None: the whole push); ``push_s``: an async
    push's duration when the run is colocate (None: as colocate's reload, listed as missing)."""
    run = load_run(run_dir)
    cfg, rows = run.config, run.rows
    if not rows:
        raise ValueError(f"{run.path}: no training steps in metrics.jsonl (time_train_s)")
    if not run.episodes:
        raise ValueError(f"{run.path}: no train episode records in rollouts/ (metrics.rollouts_per_step=0?)")
    t = run.trainer
    given: dict[str, str] = {}
    assumed: dict[str, str] = {}
    missing: list[str] = []
    fitted: dict[str, str] = {}

    # episodes
    records = [e for eps in run.episodes.values() for e in eps]
    empirical = tuple((max(1, int(e.get("turns", 1))), int(e.get("completion_tokens", 0)), int(e.get("prompt_tokens", 0)),
                       tool_waits(e)) for e in records)
    latency = (cfg.get("env", {}).get("kwargs") or {}).get("tool_latency")
    tool = Dist.from_tool_latency(latency) if latency else Dist.fixed(0.0)
    if latency:
        given["episode.tool_s"] = f"env.kwargs.tool_latency {latency}"
    else:
        missing.append("episode.tool_s: the env reports no simulated tool latency; a tool's own time is absorbed into "
                       "the generation fit")
    shares = [float(r["zero_adv_group_share"]) for r in rows if "zero_adv_group_share" in r]
    zero = statistics.fmean(shares) if shares else (_zero_adv_share(run.episodes) or 0.0)
    inference = cfg.get("inference", {})
    max_new = inference.get("max_new_tokens")
    episode = EpisodeCost(empirical=empirical, tool_s=tool, max_new_tokens=max_new, zero_adv_group_share=zero)
    fitted["episode.empirical"] = f"{len(empirical)} train episodes of {len(run.episodes)} steps (turns, completion, " \
                                  f"other tokens, tool calls)"
    fitted["episode.zero_adv_group_share"] = (f"{zero:.3f}: groups whose rewards were all equal "
                                              f"({'metrics rows' if shares else 'the recorded episodes'})")
    timed = [e["timing"] for e in records if isinstance(e.get("timing"), dict)]
    if timed:  # records of runs since the episodes say where their time went (rollout/episode.py EpisodeTiming)
        resets = tuple(float(x["reset_s"]) for x in timed)
        episode = episode.model_copy(update={"reset_s": Dist(kind="empirical", samples=resets)})
        fitted["episode.reset_s"] = (f"the {len(resets)} recorded resets, resampled (median "
                                     f"{statistics.median(resets) * 1000:.1f} ms)")
        calls = [float(g) for x in timed for g in x.get("generate_s", [])]
        steps_s = [float(v) for x in timed for v in x.get("env_s", [])]
        report_timing = {"episodes": len(timed), "engine_call_s_median": statistics.median(calls) if calls else None,
                         "engine_call_s_mean": statistics.fmean(calls) if calls else None,
                         "env_step_s_median": statistics.median(steps_s) if steps_s else None,
                         "env_step_s_mean": statistics.fmean(steps_s) if steps_s else None,
                         "episode_wall_s_mean": statistics.fmean(float(x["wall_s"]) for x in timed)}
        missing.append("sandbox time of a tool call beyond the simulated latency and the env's own step time (the "
                       "records time each env step, latency included; absorbed into the generation fit)")
    else:
        report_timing = {}
        missing += ["per-episode wall times (the run's records predate episode timings)",
                    ("sandbox time of a tool call beyond the simulated latency, the env's step and reset time (absorbed "
                     "into the generation fit)")]

    # training
    per_episode = statistics.fmean(e[1] + e[2] for e in empirical)
    if all("samples_forwarded" in r for r in rows):  # the actor's own count x the recorded episodes' mean length
        pairs = [(float(r["samples_forwarded"]) * per_episode, float(r["time_train_s"])) for r in rows]
        source = f"samples_forwarded x {per_episode:.0f} tokens (the records' mean)"
    else:  # every episode of the step recorded (metrics.rollouts_per_step large enough)
        by_step = {int(r["step"]): r for r in rows}
        pairs = [(float(_forwarded_tokens(run.episodes[s])), float(by_step[s]["time_train_s"]))
                 for s in sorted(by_step) if s in run.episodes]
        source = "the recorded episodes of groups with a gradient"
    overhead, per_token = _linear_fit([p[0] for p in pairs], [p[1] for p in pairs])
    mb = int(cfg.get("actor", {}).get("micro_batch_size", 32))
    train = TrainCost(s_per_token=per_token, step_overhead_s=overhead, micro_batch_size=mb)
    fitted["train"] = (f"time_train_s = {overhead:.3f} s + {per_token:.3g} s/token x forwarded tokens "
                       f"(least squares over {len(pairs)} steps; tokens: {source})")
    if float(cfg.get("algorithm", {}).get("kl_coef", 0.0)) > 0:
        missing.append("train.ref_s_per_token: the reference forward is inside time_train_s (colocate) or a role of "
                       "its own (async); left 0")

    # weight sync
    sync_s = statistics.median(float(r["time_sync_s"]) for r in rows)
    if t.mode == "colocate":
        async_push = push_s if push_s is not None else sync_s
        sync = SyncCost(colocate_push_s=sync_s, push_s=async_push, pause_s=pause_s)
        fitted["sync.colocate_push_s"] = f"median time_sync_s {sync_s:.4f} s"
        if push_s is None:
            missing.append("sync.push_s: an async push (DCS to another process) is not in a colocate run; taken as "
                           "colocate's reload")
        else:
            assumed["sync.push_s"] = f"{push_s} s (given)"
    else:
        sync = SyncCost(push_s=sync_s, pause_s=pause_s)
        fitted["sync.push_s"] = f"median time_sync_s {sync_s:.4f} s"
    assumed["sync.pause_s"] = (f"{pause_s} s per push (the embedded engine stages buckets)" if pause_s is not None
                               else "the whole push")

    # cluster: this machine's units, one engine and one actor
    replicas = int(cfg.get("roles", {}).get("inference", {}).get("replicas", 1))
    cluster = Cluster(gpus=replicas + 1, replicas=replicas, actor_gpus=1, colocate_replicas=1, colocate_actor_gpus=1)
    assumed["cluster"] = ("one engine and one actor of the measured speed in each mode (CPU cores: no GPU "
                          "units); contention between roles sharing cores is not modelled")

    # generation: the speed that reproduces the run's rollout (colocate) or step (async) time
    generation = GenerationCost(peak_tokens_per_s=1000.0, half_batch=half_batch,
                                max_batch=int(inference.get("max_batch", 256)))
    assumed["generation.half_batch"] = f"{half_batch} (the batch-size curve is not in a run)"
    costs = Costs(episode=episode, generation=generation, train=train, sync=sync, cluster=cluster)
    key = "time_rollout_s" if t.mode == "colocate" else "time_step_s"
    target = statistics.fmean(float(r[key]) for r in rows)
    steps = max(4 * len(rows), 48)  # more steps than the run: the fit matches its expected time, not one draw's
    peak, simulated = fit_generation(costs, t.model_copy(update={"steps": steps}), target, key=key)
    costs = costs.with_updates(generation={"peak_tokens_per_s": peak})
    fitted["generation.peak_tokens_per_s"] = (f"{peak:.1f}: simulated mean {key} {simulated:.2f} s over {steps} "
                                              f"steps against {target:.2f} s measured over {len(rows)}")
    notes = {**{k: f"fitted: {v}" for k, v in fitted.items()}, **{k: f"given: {v}" for k, v in given.items()},
             **{k: f"assumed: {v}" for k, v in assumed.items()}}
    costs = costs.model_copy(update={"notes": notes})
    report = {"run": str(run.path), "mode": t.mode, "steps": len(rows), "fitted": fitted, "given": given,
              "assumed": assumed, "missing": missing, "trainer": t.model_dump(mode="json"),
              "measured": measured_figures(run), "episode_timing": report_timing}
    return Calibration(costs, report)


def measured_figures(run: RunData) -> dict[str, float]:
    """A run's own figures, as the planner predicts them: steps/hour over the loop (the summary's, or from the rows'
    step times), mean rollout / train / sync / step time, data wait share."""
    rows = run.rows
    step_s = [float(r["time_step_s"]) for r in rows]
    out = {"steps_per_hour": float(run.summary.get("steps_per_hour") or (3600.0 * len(step_s) / sum(step_s))),
           "step_s_mean": statistics.fmean(step_s)}
    for key in ("time_rollout_s", "time_train_s", "time_sync_s"):
        out[key.replace("time_", "") + "_mean"] = statistics.fmean(float(r[key]) for r in rows)
    if "data_wait_fraction" in run.summary:
        out["data_wait_fraction"] = float(run.summary["data_wait_fraction"])
    else:  # colocate: the actor waits for the whole rollout
        out["data_wait_fraction"] = sum(float(r["time_rollout_s"]) for r in rows) / sum(step_s)
    return out
