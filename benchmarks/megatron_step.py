"""The megatron actor backend against the hf one: one training step of the default policy on a CPU, same process.

Both actors start from the same tiny random Qwen2.5-Omni thinker (the default ``build_policy()``; the megatron one
runs its language decoder as a megatron-core GPTModel) and train on the same fixed batch of rendered
demonstrations of the default recipe's env (nextqa-video: 8 video frames per prompt, as recipes/cpu-nextqa.yaml
renders them). Timed, interleaved (hf, megatron, hf, megatron, ...) after one warm-up step each:

- ``sft_step``: forward, backward, gradient clipping, AdamW -- the whole step;
- ``logprobs``: the no-grad forward the reference / old-policy passes use.

Printed: median milliseconds per backend and the megatron / hf ratio (above 1: megatron is slower), by wall clock
and by this process's CPU time (``time.process_time``: all its threads), which moves less when other jobs share
the machine.

``--ranks``: the megatron actor as a Ray rank group (``RankGroup``, one process per rank, gloo on loopback) at four
layouts, one group at a time (each closed before the next is built): ``world1`` (tp = pp = dp = 1 with
``launcher: ray``, so it takes the same launcher path as the others), ``tp2``, ``pp2`` and ``dp2``. Each group
makes one warm-up RL step (GRPO) on a fixed batch of rendered video / audio / image episodes, then ``--steps``
timed ones; the whole cycle of layouts runs ``--cycles`` times and the medians are taken. Recorded per layout: the
median wall seconds of a step, and each rank's peak RSS, parameter MiB and optimizer-state MiB (``memory()``,
after the timed steps); printed as a table with ratios to ``world1``. Each rank gets one logical CPU and one torch
thread. On a 2-core machine two ranks share the two cores with Ray's own processes, so the time ratios say little
about a GPU cluster; the per-rank parameter + optimizer bytes are the figure that carries over (tp and pp split
the decoder's weights, towers and norms stay whole; dp does not split weights). Results:
``runs/bench-megatron-ranks/last.json``.

    python benchmarks/megatron_step.py [--quick] [--repeats N]
    python benchmarks/megatron_step.py --ranks [--quick] [--steps N] [--cycles R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

RANK_LAYOUTS: dict[str, dict[str, Any]] = {
    "world1": {"launcher": "ray"},  # one rank, but through the rank group like the others
    "tp2": {"tp": 2},
    "pp2": {"pp": 2},
    "dp2": {"dp": 2},
}
RANKS_OUT = Path("runs/bench-megatron-ranks/last.json")


def _batch(processor: Any, n: int) -> list[Any]:
    import numpy as np

    import relax_gym
    from relax_gym.trainer.run.warmup import demonstration

    env = relax_gym.make("nextqa-video", split="train", video={"fps": 4.0, "max_frames": 8, "min_frames": 8})
    rng = np.random.default_rng(0)
    try:
        return [demonstration(env, processor, 1_000_000 + i, rng) for i in range(n)]
    finally:
        env.close()


def run(quick: bool = False, *, repeats: int | None = None) -> dict[str, Any]:
    import torch

    from relax_gym.trainer.actors.hf import HFActor
    from relax_gym.trainer.actors.megatron.actor import MegatronActor
    from relax_gym.trainer.policy import build_policy

    repeats = repeats or (3 if quick else 8)
    batch_size = 8 if quick else 16
    torch.manual_seed(0)
    hf_model, processor = build_policy()
    mc_model, _ = build_policy()
    actors = {"hf": HFActor(hf_model.train(), processor, lr=1e-4),
              "megatron": MegatronActor(mc_model.train(), processor, lr=1e-4)}
    try:
        items = _batch(processor, batch_size)
        tokens = sum(len(it.input_ids) for it in items)
        clocks = {"wall": time.perf_counter, "cpu": time.process_time}
        times = {(name, what, clock): [] for name in actors for what in ("sft_step", "logprobs") for clock in clocks}
        for name, actor in actors.items():  # warm-up: allocator, megatron's memory buffer
            actor.sft_step(items)
        for _ in range(repeats):
            for name, actor in actors.items():
                for what, call in (("sft_step", actor.sft_step), ("logprobs", actor.logprobs)):
                    start = {clock: tick() for clock, tick in clocks.items()}
                    call(items)
                    for clock, tick in clocks.items():
                        times[name, what, clock].append(tick() - start[clock])
        out: dict[str, Any] = {"repeats": repeats, "batch": batch_size, "tokens": tokens,
                               "threads": torch.get_num_threads()}
        for what in ("sft_step", "logprobs"):
            row: dict[str, float] = {}
            for clock in clocks:
                ms = {name: 1000 * statistics.median(times[name, what, clock]) for name in actors}
                row.update({f"hf_{clock}_ms": ms["hf"], f"megatron_{clock}_ms": ms["megatron"],
                            f"megatron_over_hf_{clock}": ms["megatron"] / ms["hf"]})
            out[what] = row
        return out
    finally:
        actors["megatron"].close()


def _rank_config(parallel: dict[str, Any]) -> Any:
    from relax_gym.trainer.config import RelaxConfig

    return RelaxConfig.model_validate({"actor": {"backend": "megatron", "lr": 1e-4, "micro_batch_size": 4,
                                                 "grad_clip": 1.0, "parallel": parallel}})


def run_ranks(quick: bool = False, *, steps: int | None = None, cycles: int | None = None,
              out: Path | None = RANKS_OUT) -> dict[str, Any]:
    """Time RL steps of the megatron rank group at each of :data:`RANK_LAYOUTS` and record each rank's memory."""
    import ray
    import torch

    from relax_gym.trainer.actors.factory import build_actor
    from relax_gym.trainer.algorithms import preset
    from relax_gym.trainer.policy import build_policy
    from relax_gym.trainer.run.seeds import seed_everything
    from relax_gym.trainer.tools.megatron_check import rl_batch

    steps = steps or (2 if quick else 5)
    cycles = cycles or (1 if quick else 2)
    per_env = 2 if quick else 4
    load_before = list(os.getloadavg())  # before this script's own processes start
    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from relax_gym.trainer.cluster.local_ray import start_local_ray

        start_local_ray(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False,
                        namespace="relax-gym-bench")
        started = True
    try:
        seed_everything(0)
        hf_model, processor = build_policy()
        total = sum(p.numel() for p in hf_model.parameters())
        decoder = sum(p.numel() for n, p in hf_model.named_parameters() if "language_model" in n)
        items = rl_batch(processor, per_env=per_env)  # 3 envs x per_env episodes, two per group
        g = torch.Generator().manual_seed(0)
        advantages = torch.randn(len(items), generator=g)
        algo = preset("grpo")
        times: dict[str, list[float]] = {name: [] for name in RANK_LAYOUTS}
        memory: dict[str, list[dict[str, float]]] = {}
        layout: dict[str, list[dict[str, Any]]] = {}
        for _ in range(cycles):
            for name, parallel in RANK_LAYOUTS.items():
                cfg = _rank_config(parallel)
                seed_everything(cfg.trainer.seed)
                model, proc = build_policy(cfg.model)
                group = build_actor(cfg, model, proc, group_name=f"bench-ranks-{name}")
                try:
                    group.rl_step(items, advantages, algo)  # warm-up
                    for _ in range(steps):
                        start = time.perf_counter()
                        group.rl_step(items, advantages, algo)
                        times[name].append(time.perf_counter() - start)
                    memory[name] = group.memory()  # the last cycle's: the figures barely move between cycles
                    layout[name] = group.layout
                finally:
                    group.close()
        base = memory["world1"][0]
        base_state = base["params_mib"] + base["optimizer_mib"]
        base_s = statistics.median(times["world1"])
        result: dict[str, Any] = {"steps": steps, "cycles": cycles, "episodes": len(items),
                                  "tokens": sum(len(it.input_ids) for it in items), "micro_batch_size": 4,
                                  "cpu_count": os.cpu_count(), "load_avg": load_before,
                                  "hf_parameters": total, "tower_share": 1 - decoder / total, "layouts": {}}
        for name, parallel in RANK_LAYOUTS.items():
            ranks = [{**mem, "rank": place["rank"], "tp": place["tp"], "pp": place["pp"], "dp": place["dp"],
                      "parameters": place["parameters"]} for mem, place in zip(memory[name], layout[name])]
            state = [r["params_mib"] + r["optimizer_mib"] for r in ranks]
            median = statistics.median(times[name])
            result["layouts"][name] = {
                "parallel": {k: v for k, v in parallel.items() if k != "launcher"} or {"tp": 1, "pp": 1, "dp": 1},
                "world": len(ranks), "step_s": times[name], "median_step_s": median,
                "step_time_over_world1": median / base_s,
                "max_rank_state_mib": max(state), "state_over_world1": max(state) / base_state,
                "peak_rss_over_world1": max(r["peak_rss_mib"] for r in ranks) / base["peak_rss_mib"], "ranks": ranks}
        result["load_avg_after"] = list(os.getloadavg())
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        if started:
            ray.shutdown()


def _print_ranks(r: dict[str, Any]) -> None:
    print(f"{r['episodes']} episodes ({r['tokens']} tokens), micro-batches of {r['micro_batch_size']}; median of "
          f"{r['steps']} steps x {r['cycles']} cycle(s) after 1 warm-up step; 1 torch thread per rank; "
          f"{r['cpu_count']} CPUs, load average {r['load_avg'][0]:.2f} before, {r['load_avg_after'][0]:.2f} after")
    print(f"{'layout':<7} {'rank':>4} {'tp/pp/dp':>8} {'step s':>7} {'x world1':>8} {'params MiB':>10} "
          f"{'optim MiB':>9} {'p+o x world1':>12} {'peak RSS MiB':>12}")
    base = r["layouts"]["world1"]["ranks"][0]
    base_state = base["params_mib"] + base["optimizer_mib"]
    for name, f in r["layouts"].items():
        for i, rank in enumerate(f["ranks"]):
            head = (f"{name:<7}", f"{f['median_step_s']:7.2f}", f"{f['step_time_over_world1']:7.2f}x") if i == 0 \
                else ("", "", "")
            place = f"{rank['tp']}/{rank['pp']}/{rank['dp']}"
            state = (rank["params_mib"] + rank["optimizer_mib"]) / base_state
            print(f"{head[0]:<7} {rank['rank']:>4} {place:>8} {head[1]:>7} {head[2]:>8} {rank['params_mib']:10.1f} "
                  f"{rank['optimizer_mib']:9.1f} {state:11.2f}x {rank['peak_rss_mib']:12.0f}")
    print("(tp/pp/dp: the rank's coordinates; p+o: parameter + optimizer-state bytes of that rank)")
    share = r["tower_share"]
    print(f"vision + audio towers: {100 * share:.0f}% of the policy's {r['hf_parameters']:,} parameters (replicated "
          f"over tp, on pp stage 0): an even tp=2 split of the rest gives {share + (1 - share) / 2:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a batch of 8 and 3 repeats; with --ranks: 6 episodes, 2 timed steps, 1 cycle")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--ranks", action="store_true", help="the rank group at world1 / tp2 / pp2 / dp2 (see above)")
    parser.add_argument("--steps", type=int, default=None, help="--ranks: timed steps per group (default 5; quick 2)")
    parser.add_argument("--cycles", type=int, default=None, help="--ranks: cycles over the layouts (default 2; quick 1)")
    args = parser.parse_args()
    if args.ranks:
        _print_ranks(run_ranks(args.quick, steps=args.steps, cycles=args.cycles))
        print(f"written: {RANKS_OUT}")
        return
    r = run(args.quick, repeats=args.repeats)
    print(f"batch {r['batch']} sequences ({r['tokens']} tokens), median of {r['repeats']}, {r['threads']} threads")
    for what in ("sft_step", "logprobs"):
        for clock in ("wall", "cpu"):
            f = r[what]
            print(f"{what:<9} {clock:<4} hf {f[f'hf_{clock}_ms']:8.1f} ms   megatron {f[f'megatron_{clock}_ms']:8.1f} ms   "
                  f"megatron / hf {f[f'megatron_over_hf_{clock}']:.2f}")


if __name__ == "__main__":
    main()
