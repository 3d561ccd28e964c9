"""Routing replay (R3) on the tiny Qwen3-Omni MoE thinker: what recording and replaying the routed experts costs, and
what it does to the routing mismatch between rollout and training.

1. Cost, in one process, interleaved (ABAB...), on one fixed batch of rollouts of the nextqa-video env
   (recipes/cpu-moe-r3.yaml): the engine's ``generate`` with and without ``return_routed_experts`` (recording), and
   an RL training step (forward + backward + AdamW) without any routing code (items carry no record), with the
   mismatch measured only, and with replay. Printed: median seconds and the ratios to the plain step.
2. Mismatch, async mode with S=2 (``trainer.mode=async trainer.max_staleness=2``): the same short run with
   ``algorithm.routing_replay`` off and on. Printed per run: the share of recorded (token, expert) choices the
   training forward's router would not make (``routing_mismatch``, mean over steps) and the share it did not use
   (``routing_mismatch_used``: 0 under replay), and the mean step time.

    python benchmarks/r3.py [--quick] [--backend hf|megatron] [--cost-only]

``--backend megatron``: the training actors (part 1) and the runs' actor (part 2) are the megatron backend's (the
thinker's decoder on megatron-core MoE layers, replay through megatron-core's router replay hook); the ratios are
still measured in one process, interleaved. ``--cost-only``: part 1 only.

Targets (issue "R3"): replay overhead <= 3 % of step time; mismatch with replay 0 for replayed tokens.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "cpu-moe-r3.yaml"
OUT = Path("runs") / "bench-r3"


def _rollouts(cfg: Any, engine: Any, processor: Any, n: int, routed: bool) -> tuple[list[Any], float]:
    """``n`` episodes of the recipe's env played against ``engine`` (one batch); their trajectories and seconds."""
    import asyncio

    import relax_gym
    from relax_gym.trainer.engines.client import AsyncEngineClient
    from relax_gym.trainer.engines.coalesce import CoalescingClient
    from relax_gym.trainer.engines.http_server import serve
    from relax_gym.trainer.policy.moe import routing_dims
    from relax_gym.trainer.rollout.episode import run_episode

    server = serve(engine, port=0)
    envs = [relax_gym.make(cfg.env.id, **cfg.env.kwargs) for _ in range(n)]

    async def play() -> list[Any]:
        raw = AsyncEngineClient(server.url)
        client = CoalescingClient(raw, max_batch=n)
        sampling = {"max_new_tokens": cfg.inference.max_new_tokens, "temperature": 1.0}
        try:
            return await asyncio.gather(*(run_episode(env, client, processor, seed=i // 4, group_id=i // 4,
                                                      sampling_params=sampling,
                                                      routing=routing_dims(cfg.model) if routed else None)
                                          for i, env in enumerate(envs)))
        finally:
            await raw.aclose()

    try:
        t0 = time.perf_counter()
        trajs = asyncio.run(play())
        return trajs, time.perf_counter() - t0
    finally:
        server.close()
        for env in envs:
            env.close()


def _training_actor(backend: str, model: Any, processor: Any, micro_batch_size: int, replay: bool) -> Any:
    """A training actor of ``backend`` on a copy of ``model`` (the megatron one converts its copy in place)."""
    from relax_gym.trainer.actors.hf import HFActor

    kwargs = dict(lr=1e-4, micro_batch_size=micro_batch_size, routing_replay=replay)
    if backend == "hf":
        return HFActor(copy.deepcopy(model), processor, **kwargs)
    from relax_gym.trainer.actors.megatron.actor import MegatronActor

    return MegatronActor(copy.deepcopy(model), processor, **kwargs)


def cost(quick: bool, backend: str = "hf") -> dict[str, Any]:
    """Part 1: recording and replay cost, interleaved in one process."""
    import torch

    from relax_gym.trainer.config import load_recipe
    from relax_gym.trainer.engines.embedded import EmbeddedEngine
    from relax_gym.trainer.policy import build_policy

    cfg = load_recipe(RECIPE, [])
    torch.manual_seed(0)
    model, processor = build_policy(cfg.model)
    engine = EmbeddedEngine(copy.deepcopy(model).eval(), processor, max_batch=64)
    n = 16 if quick else 32
    reps = 3 if quick else 6
    gen = {"plain": [], "recorded": []}
    trajs: list[Any] = []
    try:
        for r in range(reps):
            for routed in ((False, True) if r % 2 == 0 else (True, False)):  # alternate who goes first
                got, seconds = _rollouts(cfg, engine, processor, n, routed)
                gen["recorded" if routed else "plain"].append(seconds)
                if routed:
                    trajs = got
    finally:
        engine.close()
    items = [t for t in trajs if t.trainable]
    plain_items = [copy.copy(t) for t in items]
    for t in plain_items:
        t.routed_experts = None
    adv = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(items))])
    actors = {name: _training_actor(backend, model, processor, cfg.actor.micro_batch_size, name == "replay")
              for name in ("plain", "measured", "replay")}
    steps: dict[str, list[float]] = {name: [] for name in actors}
    mismatch: dict[str, float] = {}
    names = list(actors)
    rounds = 9 if quick else 21
    try:
        for r in range(rounds):
            for name in names[r % 3:] + names[: r % 3]:  # rotate the order: no actor always runs right after another
                actor = actors[name]
                t0 = time.perf_counter()
                m = actor.rl_step(plain_items if name == "plain" else items, adv, cfg.algorithm)
                steps[name].append(time.perf_counter() - t0)
                if "routing_mismatch_used" in m:
                    mismatch[name] = m["routing_mismatch_used"]
    finally:
        for actor in actors.values():
            actor.close()
    med = {name: statistics.median(v[3:]) for name, v in steps.items()}  # the first rounds warm caches up
    gmed = {name: statistics.median(v) for name, v in gen.items()}
    tokens = sum(len(t.input_ids) for t in items)
    return {
        "backend": backend, "episodes": len(items), "tokens": tokens, "rounds": rounds - 3, "generate_rounds": reps,
        "generate_s": gmed, "record_ratio": gmed["recorded"] / gmed["plain"],
        "train_step_s": med, "measure_ratio": med["measured"] / med["plain"], "replay_ratio": med["replay"] / med["plain"],
        "mismatch_used_replay": mismatch.get("replay"),
    }


def async_run(replay: bool, steps: int, run_dir: Path, backend: str = "hf") -> dict[str, Any]:
    """Part 2: one async S=2 run; mismatch and step time from its metrics."""
    from relax_gym.trainer.config import load_recipe
    from relax_gym.trainer.async_engine.controller import AsyncTrainer

    overrides = ["trainer.mode=async", "trainer.max_staleness=2", f"trainer.steps={steps}", "trainer.prompts_per_step=8",
                 "trainer.group_size=4", "trainer.sft_warmup_steps=10", "trainer.sft_batch_size=16",
                 f"trainer.eval_every={steps}", "trainer.eval_episodes=8", f"trainer.checkpoint_every={steps}",
                 "roles.bus=inprocess", "metrics.tensorboard=false", f"algorithm.routing_replay={str(replay).lower()}",
                 # every sample forwarded, so every step measures its mismatch on all of them
                 "algorithm.negative_advantage_scale=1.0", "algorithm.kl_coef=0.0", f"actor.backend={backend}"]
    cfg = load_recipe(RECIPE, overrides)
    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = AsyncTrainer(cfg, run_dir)
    try:
        trainer.run()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["step"] >= 1 and "routing_mismatch" in r]

    def mean(key: str) -> float | None:
        values = [r[key] for r in rl if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    layers = sorted(k for k in (rl[0] if rl else {}) if k.startswith("routing_mismatch_l"))
    return {"replay": replay, "steps": len(rl), "routing_mismatch": mean("routing_mismatch"),
            "routing_mismatch_used": mean("routing_mismatch_used"), "per_layer": {k: mean(k) for k in layers},
            "staleness_max": max((r.get("staleness_max", 0) for r in rl), default=0),
            "time_step_s": mean("time_step_s"), "time_train_s": mean("time_train_s"), "run_dir": str(run_dir)}


def run(quick: bool = False, backend: str = "hf", cost_only: bool = False) -> dict[str, Any]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    out = OUT / ("quick" if quick else "full") / backend
    c = cost(quick, backend)
    steps = 4 if quick else 8
    runs = {} if cost_only else {name: async_run(name == "replay", steps, out / name, backend)
                                 for name in ("no replay", "replay")}
    overhead = c["replay_ratio"] - 1.0
    targets = {
        "replay overhead <= 3% of step time": overhead <= 0.03,
        "mismatch with replay 0 for replayed tokens": c["mismatch_used_replay"] == 0.0
        and all(r["routing_mismatch_used"] == 0.0 for name, r in runs.items() if name == "replay"),
    }
    return {"cost": c, "async_s2": runs, "replay_overhead": overhead, "targets": targets, "quick": quick,
            "backend": backend}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and a 4-step async run")
    parser.add_argument("--backend", choices=("hf", "megatron"), default="hf", help="the training actor's backend")
    parser.add_argument("--cost-only", action="store_true", help="part 1 only (no async runs)")
    args = parser.parse_args()
    result = run(args.quick, args.backend, args.cost_only)
    c = result["cost"]
    console = Console(width=150)
    table = Table("figure", "plain", "with R3", "ratio", title=f"R3 cost ({c['backend']} actor), interleaved x{c['rounds']} "
                  f"({c['episodes']} episodes, {c['tokens']} tokens)")
    table.add_row("engine generate s (recording)", f"{c['generate_s']['plain']:.3f}", f"{c['generate_s']['recorded']:.3f}", f"{c['record_ratio']:.3f}")
    table.add_row("train step s (mismatch measured)", f"{c['train_step_s']['plain']:.3f}", f"{c['train_step_s']['measured']:.3f}", f"{c['measure_ratio']:.3f}")
    table.add_row("train step s (replay)", f"{c['train_step_s']['plain']:.3f}", f"{c['train_step_s']['replay']:.3f}", f"{c['replay_ratio']:.3f}")
    console.print(table)
    table = Table(f"async S=2 ({result['backend']})", "steps", "router mismatch", "used mismatch", "stale max", "step s", "train s", title="routing mismatch")
    for name, r in result["async_s2"].items():
        table.add_row(name, str(r["steps"]), f"{r['routing_mismatch']:.4f}", f"{r['routing_mismatch_used']:.4f}", str(r["staleness_max"]),
                      f"{r['time_step_s']:.2f}", f"{r['time_train_s']:.2f}")
    console.print(table)
    for name, ok in result["targets"].items():
        console.print(f"{'met' if ok else 'NOT met'}: {name}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / ("last.json" if args.backend == "hf" else f"last-{args.backend}.json")).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
