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

    python benchmarks/megatron_step.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


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
    from relax_gym.trainer.policy import build_policy
    from relax_gym.trainer.actors.megatron.actor import MegatronActor

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a batch of 8 and 3 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    r = run(args.quick, repeats=args.repeats)
    print(f"batch {r['batch']} sequences ({r['tokens']} tokens), median of {r['repeats']}, {r['threads']} threads")
    for what in ("sft_step", "logprobs"):
        for clock in ("wall", "cpu"):
            f = r[what]
            print(f"{what:<9} {clock:<4} hf {f[f'hf_{clock}_ms']:8.1f} ms   megatron {f[f'megatron_{clock}_ms']:8.1f} ms   "
                  f"megatron / hf {f[f'megatron_over_hf_{clock}']:.2f}")


if __name__ == "__main__":
    main()
