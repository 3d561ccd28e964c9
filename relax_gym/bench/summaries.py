"""Each benchmark's result dict → table rows (figure, value, ratio, note) and bar charts.

One function per known benchmark reads the dict its script's ``run()`` returns; a benchmark without one (or whose
dict no longer has the expected keys) falls back to :func:`generic`, which lists its numeric leaves, so a new or
changed script still shows up in the table instead of breaking it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    ratio: str = ""
    note: str = ""


@dataclass(frozen=True)
class Bars:
    """One bar chart: ``series`` maps a legend label to one value per entry of ``labels``."""

    title: str
    ylabel: str
    labels: list[str]
    series: dict[str, list[float]]
    log: bool = False
    reference: float | None = None  # a dashed horizontal line (e.g. 1.0 for ratios)
    reference_label: str = ""


@dataclass
class Summary:
    rows: list[Row] = field(default_factory=list)
    bars: list[Bars] = field(default_factory=list)


def num(value: Any, spec: str = ".3g", unit: str = "") -> str:
    """A number for the table; ``n/a`` for a missing one (NaN is stored as null)."""
    if value is None:
        return "n/a"
    return f"{value:{spec}}{unit}"


def times(value: Any, *, big: bool = False) -> str:
    """A ratio as ``1.23x``; ``big`` ratios (tens, thousands) with fewer decimals."""
    if value is None:
        return "n/a"
    return f"{value:.0f}x" if big and value >= 100 else f"{value:.1f}x" if big else f"{value:.2f}x"


def env_reset(f: dict[str, Any]) -> Summary:
    s = Summary()
    for c in f["cases"]:
        s.rows.append(Row(f"reset p50 cold / cached: {c['label']}",
                          f"{num(c['cold_p50_ms'], '.3g')} / {num(c['cached_p50_ms'], '.3g')} ms",
                          times(c["cold_over_cached"], big=True), "cold / cached (decode cache)"))
    s.bars.append(Bars("env reset p50 (decode included)", "ms (log scale)", [c["label"] for c in f["cases"]],
                       {"cold cache": [c["cold_p50_ms"] for c in f["cases"]],
                        "cached": [c["cached_p50_ms"] for c in f["cases"]]}, log=True))
    seek = f.get("seek", [])
    for c in seek:
        s.rows.append(Row(f"cold reset / full PyAV decode: {c['label']}",
                          f"{num(c['cold_p50_ms'], '.3g')} / {num(c['full_decode_ms'], '.3g')} ms",
                          times(c["ratio"]), f"target <= {c['target']:g}x (seeking decoder, 16 frames)"))
    if seek:
        s.bars.append(Bars("cold reset vs full decode (640x480 30 fps)", "ms", [c["label"] for c in seek],
                           {"cold reset p50": [c["cold_p50_ms"] for c in seek],
                            "full PyAV decode": [c["full_decode_ms"] for c in seek]}))
    return s


def sandbox(f: dict[str, Any]) -> Summary:
    s = Summary()
    backends = f["backends"]
    for name, b in backends.items():
        if b.get("problem"):
            s.rows.append(Row(f"{name} backend", "unavailable", note=b["problem"]))
            continue
        s.rows.append(Row(f"warm acquire p50 / p99 ({name})", f"{num(b['acquire_p50_ms'])} / {num(b['acquire_p99_ms'])} ms",
                          note="target p50 <= 5 ms"))
        if b.get("episode_ms") is not None:
            phases = ", ".join(f"{k} {v:.1f}" for k, v in (b.get("episode_phases_ms") or {}).items())
            s.rows.append(Row(f"sandbox work per tool-use episode, p50 ({name})", f"{b['episode_ms']:.1f} ms", note=phases))
    labels, ours, base = [], [], []
    for key, name, other, target in (("bwrap_exec", "bwrap", "bare_ms", "1.5x"), ("docker_exec", "docker", "raw_ms", "1.2x")):
        if key in f:
            r = f[key]
            base_name = "bare subprocess" if name == "bwrap" else "raw SDK exec_run"
            s.rows.append(Row(f"python3 -c pass: {name} exec / {base_name}", f"{r['ours_ms']:.1f} / {r[other]:.1f} ms",
                              times(r["ratio"]), f"target <= {target}"))
            labels.append(name), ours.append(r["ours_ms"]), base.append(r[other])
    r = f.get("docker_exec") or {}
    if r.get("api_ms") is not None:
        s.rows.append(Row("python3 -c pass: docker exec path / raw SDK exec_run", f"{r['api_ms']:.1f} / {r['raw_ms']:.1f} ms",
                          times(r["api_ratio"]), "RELAX_GYM_DOCKER_EXEC=api"))
        labels.append("docker-api"), ours.append(r["api_ms"]), base.append(r["raw_ms"])
    life = f.get("docker_lifecycle")
    if life:
        s.rows.append(Row("create / close one docker sandbox, p50", f"{life['create_ms']:.0f} / {life['close_ms']:.0f} ms"))
    for name, b in backends.items():
        if b.get("episodes_per_s") is not None:
            warm = b.get("warm_episodes_per_s")
            s.rows.append(Row(f"{f['episodes']} concurrent tool-use episodes ({name})", f"{b['episodes_per_s']:.2f} episodes/s",
                              note="" if warm is None else f"cold pool; {warm:.2f} episodes/s warm"))
    if labels:
        s.bars.append(Bars("python3 -c pass: one exec", "ms", labels, {"through the sandbox": ours, "baseline": base}))
    per_episode = {name: b["episode_ms"] for name, b in backends.items() if b.get("episode_ms") is not None}
    if per_episode:
        s.bars.append(Bars("sandbox work per tool-use episode", "ms", list(per_episode), {"p50": list(per_episode.values())}))
    return s


def learning(f: dict[str, Any]) -> Summary:
    s = Summary()
    note = ("quick: a short smoke run, NOT the 10-minute learning figure" if f.get("quick")
            else f"recipe {f.get('recipe', '?')}")
    if f.get("load"):
        note += f", {f['load']} busy-loop process(es) beside it"
    for r in f["seeds"]:
        at10 = f"; {r['eval_at_10min']:.3f} at 10 min" if "eval_at_10min" in r else ""
        s.rows.append(Row(f"held-out eval reward, seed {r['seed']} ({r['steps']} steps, {r['minutes']:.1f} min)",
                          f"{r['eval_reward_start']:.3f} -> {r['eval_reward_end']:.3f}", f"{r['gain']:+.3f}", note + at10))
    e = f.get("engine")
    if e:
        s.rows.append(Row("engine tok/s: EmbeddedEngine / model.generate", f"{e['engine_tok_s']:.0f} / {e['plain_tok_s']:.0f}",
                          times(e["engine_over_plain"]), f"batch {e['batch']} x {e['new_tokens']} tokens"))
        s.rows.append(Row("engine tok/s: 8 HTTP clients / model.generate", f"{e['http_tok_s']:.0f} / {e['plain_tok_s']:.0f}",
                          times(e["http_over_plain"])))
    if f["seeds"]:
        s.bars.append(Bars("held-out eval reward" + (" (quick smoke run)" if f.get("quick") else ""), "reward",
                           [f"seed {r['seed']}" for r in f["seeds"]],
                           {"start": [r["eval_reward_start"] for r in f["seeds"]],
                            "end": [r["eval_reward_end"] for r in f["seeds"]]}))
    return s


def modes(f: dict[str, Any]) -> Summary:
    s = Summary()
    w = f.get("workload", {})
    for mode, r in f["modes"].items():
        s.rows.append(Row(f"steps/hour, {mode} ({r['steps']} steps)", f"{r['steps_per_hour']:.0f}", times(r["speedup"]),
                          f"x colocate; eval {num(r['eval_reward_end'], '.3f')}, data wait {_pct(r['data_wait_fraction'])}"
                          + (f", {r['samples_discarded_stale']} samples discarded as stale" if r.get("samples_discarded_stale") else "")))
    for target, met in f.get("targets", {}).items():
        s.rows.append(Row(f"target: {target}", "met" if met else "NOT met"))
    s.bars.append(Bars(f"trainer modes ({w.get('steps', '?')} steps, tool latency)", "RL steps per hour", list(f["modes"]),
                       {"steps/hour": [r["steps_per_hour"] for r in f["modes"].values()]}))
    return s


def convergence(f: dict[str, Any]) -> Summary:
    s = Summary()
    w = f.get("workload", {})
    note = "quick: a smoke run from a random policy, NOT the convergence figure" if w.get("quick") else "x colocate steps/hour"
    for mode, r in f["modes"].items():
        s.rows.append(Row(f"{mode}: held-out reward after {r['steps']} steps", f"{num(r['eval_reward_start'], '.3f')} -> "
                          f"{num(r['eval_reward_end'], '.3f')}", times(r["speedup"]), f"{note}; {r['steps_per_hour']:.0f} steps/h"))
    for target, met in f.get("targets", {}).items():
        s.rows.append(Row(f"target: {target}", "met" if met else "NOT met"))
    s.bars.append(Bars(f"final held-out reward by mode ({w.get('steps', '?')} steps, same base and seed)", "reward",
                       list(f["modes"]), {"end": [r["eval_reward_end"] for r in f["modes"].values()]}))
    return s


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


def weight_sync(f: dict[str, Any]) -> Summary:
    s = Summary()
    floor = f["floor"]
    s.rows.append(Row(f"loopback socket floor, {f['model_mib']:.0f} MiB", f"{floor['mib_per_s']:.0f} MiB/s", "1.00x"))
    paths = [(k, label) for k, label in (("tcp", "tcp"), ("tcp_unstaged", "tcp, unstaged"), ("disk", "disk")) if k in f]
    for key, label in paths:
        r = f[key]
        paused = f", engine paused {r['paused_s']:.3f} s" if "paused_s" in r else ""
        s.rows.append(Row(f"DCS push over {label}", f"{r['mib_per_s']:.0f} MiB/s ({r['seconds']:.3f} s{paused})",
                          times(r["vs_floor"]), f"vs floor (median of {f.get('rounds', 1)} rounds); weights "
                          + ("bit-identical" if r.get("verified") else "DIFFER")))
    s.bars.append(Bars(f"weight push, {f['model_mib']:.0f} MiB", "MiB/s", ["loopback floor", *(f"DCS {label}" for _, label in paths)],
                       {"MiB/s": [floor["mib_per_s"], *(f[key]["mib_per_s"] for key, _ in paths)]}))
    return s


def databus(f: dict[str, Any]) -> Summary:
    s = Summary()
    shape = f"{f['rows']} x 1 MB rows, batches of {f['batch']}"
    s.rows.append(Row(f"put: bus / raw TransferQueue ({shape})", f"{f['bus_put_mb_s']:.0f} / {f['raw_put_mb_s']:.0f} MB/s",
                      times(f["put_ratio"]), "time ratio, 1.0 = no overhead"))
    s.rows.append(Row("fetch + ack / raw get", f"{f['bus_get_mb_s']:.0f} / {f['raw_get_mb_s']:.0f} MB/s", times(f["get_ratio"])))
    s.rows.append(Row("put + get, bus / raw", "", times(f["total_ratio"])))
    s.rows.append(Row("empty fetch attempt, bus / raw", f"{f['bus_empty_fetch_ms']:.2f} / {f['raw_empty_get_ms']:.2f} ms",
                      times(f["bus_empty_fetch_ms"] / f["raw_empty_get_ms"])))
    s.bars.append(Bars("data bus time / raw TransferQueue time", "ratio", ["put", "fetch + ack", "total"],
                       {"bus / raw": [f["put_ratio"], f["get_ratio"], f["total_ratio"]]}, reference=1.0,
                       reference_label="no overhead"))
    return s


def r3(f: dict[str, Any]) -> Summary:
    s = Summary()
    c = f["cost"]
    s.rows.append(Row("R3 train step: replay / no routing code", f"{c['train_step_s']['replay']:.3f} / {c['train_step_s']['plain']:.3f} s",
                      times(c["replay_ratio"]), f"interleaved x{c['rounds']}; mismatch measured only: {times(c['measure_ratio'])}"))
    s.rows.append(Row("R3 engine generate: recording / not", f"{c['generate_s']['recorded']:.3f} / {c['generate_s']['plain']:.3f} s",
                      times(c["record_ratio"])))
    for name, r in f["async_s2"].items():
        s.rows.append(Row(f"routing mismatch, async S=2, {name}", f"{num(r['routing_mismatch'], '.4f')}",
                          note=f"experts used vs recorded: {num(r['routing_mismatch_used'], '.4f')}"))
    for target, met in f.get("targets", {}).items():
        s.rows.append(Row(f"target: {target}", "met" if met else "NOT met"))
    runs = f["async_s2"]
    s.bars.append(Bars("routing mismatch, async S=2", "share of recorded choices", list(runs),
                       {"router's own top-k": [r["routing_mismatch"] or 0.0 for r in runs.values()],
                        "experts used": [r["routing_mismatch_used"] or 0.0 for r in runs.values()]}))
    return s


def faults(f: dict[str, Any]) -> Summary:
    s = Summary()
    clean, hit = f["clean"], f["faulted"]
    injected = ", ".join(f"{k} {v}" for k, v in hit["faults_injected"].items() if ":" not in k) or "none"
    s.rows.append(Row(f"faults injected ({f['workload']['steps']} steps)", injected))
    level1 = ", ".join(f"{k} {v}" for k, v in hit["restarts_level1"].items()) or "none"
    s.rows.append(Row("restarts: level 1 (by role) / level 2", f"{level1} / {hit['restarts_level2']}"))
    s.rows.append(Row("samples produced / consumed / lost / duplicated",
                      f"{hit['samples_produced']} / {hit['samples_consumed']} / {hit['samples_lost']} / {hit['samples_duplicated']}",
                      note=f"{hit['samples_regenerated']} regenerated after the rollback; {hit['masked_engine_error']} masked by engine errors"))
    s.rows.append(Row("steps completed, faulted / clean", f"{hit['steps']} / {clean['steps']}"))
    s.rows.append(Row("wall time, faulted / clean", f"{hit['wall_s']:.0f} / {clean['wall_s']:.0f} s", times(f["wall_ratio"])))
    s.bars.append(Bars("wall time of the same run", "seconds", ["clean", "faulted"], {"wall": [clean["wall_s"], hit["wall_s"]]}))
    return s


def megatron_step(f: dict[str, Any]) -> Summary:
    s = Summary()
    labels = {"sft_step": "SFT step (forward + backward + AdamW)", "logprobs": "log-prob forward (no grad)"}
    for key, label in labels.items():
        r = f[key]
        s.rows.append(Row(f"{label}: megatron / hf", f"{r['megatron_wall_ms']:.0f} / {r['hf_wall_ms']:.0f} ms",
                          times(r["megatron_over_hf_wall"]),
                          f"CPU time {times(r['megatron_over_hf_cpu'])}; batch {f['batch']}, {f['tokens']} tokens, x{f['repeats']}"))
    s.bars.append(Bars("step time by actor backend", "ms", list(labels.values()),
                       {"hf": [f[k]["hf_wall_ms"] for k in labels], "megatron": [f[k]["megatron_wall_ms"] for k in labels]}))
    return s


def agent_learning(f: dict[str, Any]) -> Summary:
    s = Summary()
    quick = f.get("settings", {}).get("quick")
    seed = f.get("settings", {}).get("seed", "?")
    note = "quick: a smoke run of the pipeline, NOT the figure" if quick else f"seed {seed}, from the shared prior"
    for r in f["arms"]:
        seen = (f"event seen {round(r['event_seen_share'] * r['episodes_with_event'])} of {r['episodes_with_event']}"
                if r.get("episodes_with_event") else "no event clips")
        s.rows.append(Row(f"held-out eval reward, {r['arm']} ({r['steps']} RL steps)",
                          f"{r['eval_reward_start']:.3f} -> {r['eval_reward_end']:.3f}",
                          f"{r['eval_reward_end'] - r['eval_reward_start']:+.3f}",
                          f"{note}; tool calls/episode {r['eval_tool_calls_end']:.2f}; {seen}"))
    by_arm = {r["arm"]: r for r in f["arms"]}
    if {"tools", "no tools"} <= set(by_arm) and not quick:
        gap = by_arm["tools"]["eval_reward_end"] - by_arm["no tools"]["eval_reward_end"]
        s.rows.append(Row("target: tools above no tools at the end", "met" if gap > 0 else "NOT met", f"{gap:+.3f}"))
    s.bars.append(Bars("agentic video: held-out eval reward" + (" (quick smoke run)" if quick else ""), "reward",
                       [r["arm"] for r in f["arms"]], {"start": [r["eval_reward_start"] for r in f["arms"]],
                                                       "end": [r["eval_reward_end"] for r in f["arms"]]}))
    return s


def generic(f: dict[str, Any], limit: int = 12) -> Summary:
    """Numeric and boolean leaves by their dotted key (the first ``limit``)."""
    leaves: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, bool):
            leaves.append((prefix, "yes" if value else "no"))
        elif isinstance(value, int | float):
            leaves.append((prefix, num(value, ".4g")))

    walk("", f)
    rows = [Row(key, value) for key, value in leaves[:limit]]
    if len(leaves) > limit:
        rows.append(Row(f"(and {len(leaves) - limit} more figures in the results file)", ""))
    return Summary(rows=rows)


SUMMARIES: dict[str, Callable[[dict[str, Any]], Summary]] = {
    "env_reset": env_reset, "sandbox": sandbox, "learning": learning, "modes": modes,
    "weight_sync": weight_sync, "databus": databus, "r3": r3, "faults": faults, "megatron_step": megatron_step,
    "agent_learning": agent_learning, "convergence": convergence,
}


def summarise(name: str, figures: dict[str, Any]) -> Summary:
    """The rows and charts for one benchmark's figures; never raises."""
    fn = SUMMARIES.get(name)
    if fn is None:
        summary = generic(figures)
    else:
        try:
            summary = fn(figures)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            summary = generic(figures)
            summary.rows.insert(0, Row("(figures not in the expected shape; raw values follow)", "",
                                       note=f"{type(exc).__name__}: {exc}"))
    if not summary.rows:
        summary.rows.append(Row("(run() returned no numeric figures)", ""))
    return summary
