"""Agentic video: does the agent that calls tools learn above the same model without tools?

The env is ``nextqa-video-agent`` as recipes/cpu-nextqa-agent.yaml trains it: four keyframes first; the event that
answers the question (a red square darting out and back, blue squares flashing up) happens between them, so the
first look alone leaves the answer near chance, and ``watch(start_s, end_s, fps)`` / ``frame(t_s)`` show the span. A
random-init tiny policy cannot learn to *see* that event within an agentic run (on the single-turn task it needs
~2000 clips and 400-800 RL steps, docs/benchmarks.md "Learning"), so both arms start from one perception prior:

1. base: a policy that perceives the single-turn NExT-QA sample (red-square motion, blue-square counts):
   ``--base DIR`` (a checkpoint, e.g. runs/bench-learning-seed0/checkpoints/step_000700 of
   ``python benchmarks/learning.py --seeds 0``), or else trained here once: the default recipe for ``--base-steps``
   RL steps (cached in runs/bench-agent/base; ~10 minutes on the 2-core reference machine).
2. clips: an agent sample with more clips than the bundled one (2000 train, 96 val, its own seed), written once to
   runs/bench-agent/data (~50 s): with the bundled 48 training clips a tiny model memorises them.
3. prior: the base after supervised fine-tuning on the *true* answers of both arms' gold plans on the training
   clips, alternating (tools: watch the whole clip, then answer; no tools: answer from the keyframes), cached in
   runs/bench-agent/prior. Tried first and dropped (docs/benchmarks.md "Agentic video"): a single-turn perception
   prior followed by the recipe's format warm-up, whose random answer letters wash out what the prior learned.
4. two arms of the agent recipe from that prior, same seed and steps: ``tools`` and ``no tools``
   (``env.kwargs.tools_enabled=false``: no tool listed, a call is refused, the answer must come from the keyframes).
   Both skip the recipe's format warm-up (the prior has both formats) and run GRPO with positive-part advantages
   (as the default single-turn recipe) at half the recipe's lr (1e-4); greedy eval on the 96 held-out clips.

Printed per arm: eval reward and accuracy of the prior (start) and at the end, the best eval reward, mean tool
calls per eval episode, and for the final policy the share of eval episodes (of those with an event: a "still"
square has none) whose ``watch`` calls sampled at least one frame of the event.

    python benchmarks/agent_learning.py [--base DIR] [--steps N] [--seed S] [--prior-steps N] [override ...]

Overrides (``section.key=value``) apply to both arms. Wall time on the 2-core reference machine: both arms ~5
minutes (60 RL steps each: tools ~4, no tools ~1), with the clips (~50 s), the prior (160 SFT steps of 16 gold
episodes: ~5 minutes on a quiet machine, 14 with another benchmark running) and, without ``--base``, the base
(~10 minutes) made on the first run and cached: ~21 minutes from a fresh clone. Run dirs:
runs/bench-agent/<arm>-seed<S><tag>; the figures also go to runs/bench-agent/last-seed<S><tag>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "cpu-nextqa-agent.yaml"
BASE_RECIPE = ROOT / "recipes" / "cpu-nextqa.yaml"
OUT = Path("runs") / "bench-agent"
DATA = {"n_val": 96, "n_train": 2000, "seed": 7}
# both arms, on top of the recipe: the prior already has both answer formats, so no format warm-up (its random
# letters would wash out what the prior learned); GRPO's positive-part advantages, as in the default recipe; half
# the recipe's lr (at 2e-4 one seed in three dropped the tool and both arms collapsed; docs/benchmarks.md)
SETTINGS = ["trainer.sft_warmup_steps=0", "algorithm.negative_advantage_scale=0.0", "actor.lr=1e-4"]
SYSTEM = "Think inside <think></think>, then answer with the option letter inside <answer></answer>."
ARMS = {
    "tools": [],
    "no tools": ["env.kwargs.tools_enabled=false", f"env.kwargs.instructions='{SYSTEM}'"],
}


# -- stages ---------------------------------------------------------------------------------------------------


def _train(recipe: Path, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from relax_gym.trainer.colocate import ColocateTrainer
    from relax_gym.trainer.config import load_recipe

    cfg = load_recipe(recipe, overrides)
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl appends: a rerun must not mix with the last
    trainer = ColocateTrainer(cfg, run_dir)
    try:
        return trainer.run()
    finally:
        trainer.close()


def ensure_data(out: Path = OUT / "data", **spec: int) -> Path:
    """The agent clips of both stages: written once (``done.json`` records the spec; another spec rewrites)."""
    from relax_gym.envs.synth import write_nextqa_agent_sample

    spec = {**DATA, **spec}
    marker = out / "done.json"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return out
    shutil.rmtree(out, ignore_errors=True)
    write_nextqa_agent_sample(out, **spec)
    marker.write_text(json.dumps(spec))
    return out


def ensure_base(base: str | None, steps: int, seed: int, out: Path = OUT / "base", extra: list[str] | None = None) -> Path:
    """``base`` if given; else the default single-turn recipe trained for ``steps`` RL steps, once (``extra``:
    further overrides, for the smoke run)."""
    if base is not None:
        return Path(base)
    ckpt = out / "checkpoints" / f"step_{steps:06d}"
    if not (ckpt / "config.json").is_file():
        _train(BASE_RECIPE, [f"trainer.steps={steps}", "trainer.time_budget_s=null", f"trainer.checkpoint_every={steps}",
                             f"trainer.seed={seed}", f"model.seed={seed}", "metrics.tensorboard=false", *(extra or [])], out)
    return ckpt


def ensure_prior(base: Path, arm_env: dict[str, tuple[str, dict[str, Any]]], steps: int, seed: int,
                 out: Path = OUT / "prior", batch: int = 16, lr: float = 1e-3) -> Path:
    """The policy both arms start from: ``base`` after ``steps`` SFT steps on the true answers of the gold plans of
    *both* arms' training envs, alternating (tools: watch the whole clip, then answer; no tools: answer from the
    keyframes). It knows both formats and has seen the label of each training clip it met, so the arms differ
    only in what their env lets them see. Cached by its spec."""
    import random

    import torch

    import relax_gym
    from relax_gym.trainer.actors.hf import HFActor
    from relax_gym.trainer.run.warmup import demonstration
    from relax_gym.trainer.policy import PolicyConfig, build_policy, save_policy

    spec = {"base": str(base), "envs": arm_env, "steps": steps, "seed": seed, "batch": batch, "lr": lr}
    marker = out / "prior.json"
    if marker.is_file() and json.loads(marker.read_text())["spec"] == json.loads(json.dumps(spec)):
        return out / "policy"
    shutil.rmtree(out, ignore_errors=True)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model, processor = build_policy(PolicyConfig(path=str(base)))
    model.train()
    actor = HFActor(model, processor, lr=lr, micro_batch_size=8)
    envs = [relax_gym.make(env_id, **kwargs) for env_id, kwargs in arm_env.values()]
    nll = []
    try:
        for step in range(steps):
            first = 2_000_000 + step * batch
            m = actor.sft_step([demonstration(envs[i % len(envs)], processor, first + i, random_answers=False, max_turns=8,
                                                short_tool_thoughts=True) for i in range(batch)])
            nll.append(m["sft_nll"])
            if (step + 1) % 20 == 0:
                print(f"prior: SFT step {step + 1}/{steps}, nll {m['sft_nll']:.3f}", flush=True)
    finally:
        for env in envs:
            env.close()
    save_policy(model, processor, out / "policy")
    marker.write_text(json.dumps({"spec": spec, "sft_nll_first_last": [nll[0], nll[-1]] if nll else []}, indent=2))
    return out / "policy"


# -- where the agent looked ------------------------------------------------------------------------------------


def event_frames(video: Path) -> set[int]:
    """Frames of a synthetic agent clip where something differs from its resting picture (the dart, the flash)."""
    from relax_gym.omni import MediaSource, VideoPart, VideoSampling

    clip = VideoPart(MediaSource.of(video), VideoSampling(fps=1000.0, min_frames=1, max_frames=10**6)).decode()
    frames = clip.frames.astype(np.int16)
    rest = np.median(frames, axis=0)
    changed = (np.abs(frames - rest).max(axis=-1) > 80).sum(axis=(1, 2))
    return {i for i, n in enumerate(changed) if n >= 20}


def watched_frames(action_text: str, native_fps: float, duration_s: float) -> set[int]:
    """Frame indices the ``watch`` and ``frame`` calls in the agent's text sample (calls the env refuses count too:
    the refusals are rare and the tools-off arm runs none, which its tool-call count shows)."""
    from relax_gym.envs.tools import ToolCall, parse_tool_calls
    from relax_gym.omni import VideoSampling
    from relax_gym.omni.decode import sample_times

    seen: set[int] = set()
    for call in parse_tool_calls(action_text):
        if not isinstance(call, ToolCall):
            continue
        try:
            if call.name == "watch":
                a = call.arguments
                start, end = float(a["start_s"]), min(float(a["end_s"]), duration_s)
                times = sample_times(start, end, VideoSampling(fps=float(a.get("fps", 2.0)), min_frames=1, max_frames=10**6), native_fps)
            elif call.name == "frame":
                times = [float(call.arguments["t_s"])]
            else:
                continue
        except (KeyError, TypeError, ValueError):
            continue
        seen |= {int(t * native_fps) for t in times}
    return seen


async def _coverage(trainer, cfg, n: int) -> dict[str, float]:
    import relax_gym
    from relax_gym.trainer.engines.coalesce import CoalescingClient
    from relax_gym.trainer.rollout.episode import run_episode

    raw = trainer.engine_host.async_client()
    client = CoalescingClient(raw, max_batch=cfg.inference.max_batch)
    kwargs = {**cfg.env.kwargs, **cfg.env.eval_kwargs}
    envs = [relax_gym.make(cfg.env.id, **kwargs) for _ in range(min(n, 32))]
    pool: asyncio.Queue = asyncio.Queue()
    for env in envs:
        pool.put_nowait(env)
    greedy = {"max_new_tokens": cfg.inference.max_new_tokens, "temperature": 0.0, "top_p": 1.0}

    async def one(i: int):
        env = await pool.get()
        try:  # the trainer's eval seeds: the same episodes as its last eval
            return await run_episode(env, client, trainer.processor, seed=500_000 + i, group_id=i, sampling_params=greedy,
                                     max_turns=cfg.trainer.max_turns)
        finally:
            pool.put_nowait(env)

    try:
        trajs = await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await raw.aclose()
    probe = envs[0]  # which clip each eval seed drew: the same seed gives the same episode
    picked = [probe.unwrapped.samples[probe.reset(seed=500_000 + i)[1]["sample_index"]] for i in range(n)]
    for env in envs:
        env.close()
    with_event = covered = 0
    for t, sample in zip(trajs, picked):
        event = event_frames(sample.media["video"])
        if not event:
            continue
        text = trainer.processor.decode([i for i, m in zip(t.input_ids, t.loss_mask) if m])
        with_event += 1
        covered += bool(watched_frames(text, 8.0, 6.0) & event)
    return {"episodes_with_event": with_event, "event_seen_share": covered / with_event if with_event else float("nan")}


def run_arm(name: str, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from relax_gym.trainer.colocate import ColocateTrainer
    from relax_gym.trainer.config import load_recipe

    cfg = load_recipe(RECIPE, [*overrides, *ARMS[name]])
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    trainer = ColocateTrainer(cfg, run_dir)
    try:
        summary = trainer.run()
        coverage = asyncio.run(_coverage(trainer, cfg, cfg.trainer.eval_episodes))
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_reward" in r]
    best = max(evals, key=lambda r: r["eval_reward"])
    n = cfg.trainer.eval_episodes
    acc = summary.get("eval_accuracy_end", 0.0)  # absent when no eval episode ever answered (all truncated)
    return {
        "arm": name, "steps": summary["steps"], "minutes": (time.perf_counter() - t0) / 60,
        "eval_reward_start": summary["eval_reward_start"], "eval_reward_end": summary["eval_reward_end"],
        "eval_accuracy_start": summary.get("eval_accuracy_start", 0.0), "eval_accuracy_end": acc,
        "eval_accuracy_end_se": math.sqrt(acc * (1 - acc) / n), "eval_episodes": n,
        "best_eval_reward": best["eval_reward"], "best_step": best["step"],
        "eval_tool_calls_start": evals[0]["eval_tool_calls"], "eval_tool_calls_end": evals[-1]["eval_tool_calls"],
        **coverage, "run_dir": str(run_dir),
    }


def run(quick: bool = False, *, base: str | None = None, base_steps: int = 700, steps: int = 60, seed: int = 0,
        prior_steps: int = 160, prior_seed: int = 0, overrides: list[str] | tuple[str, ...] = (),
        out: Path | None = None, tag: str = "") -> dict[str, Any]:
    """All stages; returns ``{"prior": {...}, "arms": [per-arm figures], "settings": {...}}``. ``quick`` is a smoke run
    of the pipeline (tiny data and steps, under a minute): its figures say nothing about learning. ``out``: where
    the data, the base, the prior and the run dirs go (default runs/bench-agent, or runs/bench-agent/quick)."""
    from relax_gym.trainer.config import load_recipe

    out = Path(out) if out is not None else (OUT / "quick" if quick else OUT)
    prior_batch = 16
    if quick:
        data = ensure_data(out / "data", n_val=4, n_train=8)
        base_path = ensure_base(base, 2, seed, out / "base", ["model.base=null", "trainer.eval_episodes=4", "trainer.prompts_per_step=2",
                                                              "trainer.sft_warmup_steps=2"])
        prior_steps, prior_batch = 2, 2  # a gold episode of each arm per step (16 long ones cost ~40 s a step)
        sizes = ["trainer.steps=2", "trainer.prompts_per_step=2", "trainer.group_size=2", "trainer.eval_episodes=4",
                 "trainer.eval_every=2", "trainer.checkpoint_every=2"]
    else:
        data = ensure_data(out / "data")
        base_path = ensure_base(base, base_steps, seed, out / "base")
        sizes = [f"trainer.steps={steps}", "trainer.eval_episodes=96", f"trainer.checkpoint_every={steps}"]
    common = [f"env.kwargs.data_dir={data}", *SETTINGS, "trainer.time_budget_s=null", f"trainer.seed={seed}",
              "metrics.tensorboard=false", *sizes, *overrides]
    configs = {name: load_recipe(RECIPE, [*common, *ARMS[name]]) for name in ARMS}
    prior = ensure_prior(base_path, {name: (c.env.id, dict(c.env.kwargs)) for name, c in configs.items()}, prior_steps,
                         prior_seed, out / "prior", batch=prior_batch)
    arms = [run_arm(name, [f"model.path={prior}", "model.base=null", *common], out / f"{name.replace(' ', '-')}-seed{seed}{tag}") for name in ARMS]
    return {"prior": {"path": str(prior), "base": str(base_path), "sft_steps": prior_steps, "sft_batch": prior_batch},
            "arms": arms, "settings": {"quick": quick, "seed": seed, "steps": steps, "common": common}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=None, help="a perceiving single-turn checkpoint (default: train one here)")
    parser.add_argument("--base-steps", type=int, default=700)
    parser.add_argument("--steps", type=int, default=60, help="RL steps per arm")
    parser.add_argument("--prior-steps", type=int, default=160, help="SFT steps (16 gold episodes each) of the prior")
    parser.add_argument("--seed", type=int, default=0, help="the arms' seed (the prior is shared: --prior-seed)")
    parser.add_argument("--prior-seed", type=int, default=0)
    parser.add_argument("--tag", default="", help="appended to the run dirs' names (runs with overrides)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of the pipeline, not the figure")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to both arms")
    args = parser.parse_args()
    result = run(args.quick, base=args.base, base_steps=args.base_steps, steps=args.steps, seed=args.seed,
                 prior_steps=args.prior_steps, prior_seed=args.prior_seed, overrides=args.overrides, tag=args.tag)
    console = Console(width=160)
    prior = result["prior"]
    console.print(f"prior {prior['path']}: {prior['base']} + {prior['sft_steps']} SFT steps on both arms' gold plans")
    table = Table("arm", "steps", "minutes", "eval reward start -> end", "eval accuracy start -> end", "best eval (step)",
                  "tool calls / episode", "event seen", title=f"agentic video, {RECIPE.name} from the prior, seed {args.seed}")
    for r in result["arms"]:
        table.add_row(r["arm"], str(r["steps"]), f"{r['minutes']:.1f}",
                      f"{r['eval_reward_start']:.3f} -> {r['eval_reward_end']:.3f}",
                      f"{r['eval_accuracy_start']:.3f} -> {r['eval_accuracy_end']:.3f} ± {r['eval_accuracy_end_se']:.3f}",
                      f"{r['best_eval_reward']:.3f} ({r['best_step']})",
                      f"{r['eval_tool_calls_start']:.2f} -> {r['eval_tool_calls_end']:.2f}",
                      f"{round(r['event_seen_share'] * r['episodes_with_event'])} of {r['episodes_with_event']}"
                      if r["episodes_with_event"] else "-")
    console.print(table)
    tools, bare = result["arms"]
    console.print(f"tools - no tools, eval reward at the end: {tools['eval_reward_end'] - bare['eval_reward_end']:+.3f}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / ("quick.json" if args.quick else f"last-seed{args.seed}{args.tag}.json")).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
