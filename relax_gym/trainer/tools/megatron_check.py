"""Check the megatron backend on one device: ``python -m relax_gym.trainer.tools.megatron_check --device cpu|cuda
[--steps N]``.

It builds the tiny random policy (the default Qwen2.5-Omni thinker), converts a copy to the megatron backend and

1. compares the token log-probs of the HF thinker and the Megatron thinker on one batch of rendered demonstrations
   with video, audio and image inputs (so the 3-D multimodal rope is exercised), fp32: max abs diff <= 1e-4;
2. checks the conversion: the Megatron thinker's HF-named weights equal the HF thinker's, bit for bit;
3. runs N supervised training steps of the megatron actor on that batch: every loss finite, the weights changed.

It prints one JSON line (``{"ok": ..., ...}``) and exits 0 when every check passed, 1 when one failed, 2 when the
device cannot be used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from typing import Any

TOLERANCE = 1e-4
ENVS = ("nextqa-video", "echo-ink", "image-zoom")  # video; audio; image

__all__ = ["TOLERANCE", "demonstration_batch", "logprob_gap", "main", "rl_batch", "run_check"]


def demonstration_batch(processor: Any, per_env: int = 2, *, seed: int = 0) -> list[Any]:
    """Rendered gold-policy episodes of the video, audio and image envs (same seeds, same batch every time)."""
    import numpy as np

    import relax_gym
    from relax_gym.trainer.run.warmup import demonstration

    rng = np.random.default_rng(seed)
    items = []
    for env_id in ENVS:
        env = relax_gym.make(env_id)
        try:
            items += [demonstration(env, processor, seed + i, rng) for i in range(per_env)]
        finally:
            env.close()
    return items


def rl_batch(processor: Any, per_env: int = 2, *, seed: int = 0) -> list[Any]:
    """:func:`demonstration_batch` as trajectories an RL step takes (group ids, rollout log-probs of 0: no
    importance correction unless a cap is set), two episodes per group."""
    from relax_gym.trainer.rollout.episode import Trajectory

    return [Trajectory(group_id=i // 2, seed=seed + i, input_ids=r.input_ids, loss_mask=r.loss_mask,
                       rollout_logprobs=[0.0] * len(r.input_ids), mm=r.mm)
            for i, r in enumerate(demonstration_batch(processor, per_env, seed=seed))]


def logprob_gap(hf_actor: Any, megatron_actor: Any, items: list[Any]) -> tuple[float, int]:
    """(max |HF - Megatron| token log-prob over the loss-mask tokens, how many tokens were compared)."""
    import torch

    with torch.no_grad():
        hf_lps, mask = hf_actor.forward_logprobs(items)
        mc_lps, _ = megatron_actor.forward_logprobs(items)
    where = mask.bool()
    return float((hf_lps - mc_lps)[where].abs().max()), int(where.sum())


def run_check(device: str, steps: int) -> dict[str, Any]:
    import torch

    from relax_gym.trainer.actors.hf import HFActor
    from relax_gym.trainer.policy import build_policy
    from relax_gym.trainer.actors.megatron.actor import MegatronActor
    from relax_gym.trainer.actors.megatron.cpu_patch import cpu_patch_applied

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 matmuls and convolutions
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    failures: list[str] = []
    hf_model, processor = build_policy()
    hf_reference = {k: v.clone() for k, v in hf_model.state_dict().items()}
    hf_actor = HFActor(hf_model.to(device).train(), processor, lr=1e-3)
    megatron_model, _ = build_policy()
    actor = MegatronActor(megatron_model.train(), processor, lr=1e-3, micro_batch_size=8)
    try:
        items = demonstration_batch(processor)
        gap, tokens = logprob_gap(hf_actor, actor, items)
        if not gap <= TOLERANCE:
            failures.append(f"HF/Megatron log-prob gap {gap:.3g} > {TOLERANCE}")
        converted = actor.state_dict()
        exact = list(converted) == list(hf_reference) and all(torch.equal(converted[k].cpu(), v) for k, v in hf_reference.items())
        if not exact:
            failures.append("the Megatron thinker's HF-named weights differ from the HF thinker's")
        losses, seconds = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            losses.append(actor.sft_step(items)["sft_nll"])
            seconds.append(time.perf_counter() - t0)
        if not all(math.isfinite(x) for x in losses):
            failures.append(f"non-finite training loss: {losses}")
        after = actor.state_dict()
        changed = sum(not torch.equal(after[k].cpu(), v) for k, v in hf_reference.items())
        if steps and not changed:
            failures.append("no weight changed after training")
        return {
            "ok": not failures, "device": str(actor.device), "failures": failures,
            "logprob_max_abs_diff": gap, "tolerance": TOLERANCE, "tokens_compared": tokens, "samples": len(items),
            "conversion_bit_exact": exact, "steps": steps, "losses": [round(x, 6) for x in losses],
            "tensors_changed": changed, "tensors": len(hf_reference),
            "step_ms_median": round(1000 * sorted(seconds)[len(seconds) // 2], 2) if seconds else None,
            "cpu_patch": cpu_patch_applied(),
        }
    finally:
        actor.close()


def run_group_check(device: str) -> dict[str, Any]:
    """The rank-group path at world size 1 (``actor.parallel.launcher=ray``: a Ray placement group, one rank
    process, the process group multi-GPU runs make) against the in-process actor: the same gathered weights, bit
    for bit, and one RL step to the same loss and weights within the tolerance."""
    import ray
    import torch

    from relax_gym.trainer.actors.megatron.actor import MegatronActor
    from relax_gym.trainer.actors.factory import build_actor
    from relax_gym.trainer.algorithms import preset
    from relax_gym.trainer.config import RelaxConfig
    from relax_gym.trainer.policy import build_policy
    from relax_gym.trainer.run.seeds import seed_everything

    gpus = 1 if device == "cuda" else 0
    cfg = RelaxConfig.model_validate({"actor": {"backend": "megatron", "lr": 1e-3, "micro_batch_size": 4, "parallel": {
        "launcher": "ray", "num_gpus_per_rank": gpus}}})
    started = not ray.is_initialized()
    if started:
        from relax_gym.trainer.cluster.local_ray import start_local_ray

        start_local_ray(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    failures: list[str] = []
    group = one = None
    try:
        seed_everything(0)
        model, processor = build_policy(cfg.model)
        t0 = time.perf_counter()
        group = build_actor(cfg, model, processor)
        start_s = time.perf_counter() - t0
        seed_everything(0)
        reference, _ = build_policy(cfg.model)
        one = MegatronActor(reference.train(), processor, lr=1e-3, micro_batch_size=4)
        mine, theirs = one.state_dict(), group.state_dict()
        identical = mine.keys() == theirs.keys() and all(torch.equal(mine[k].cpu(), theirs[k].cpu()) for k in mine)
        if not identical:
            failures.append("the group's gathered weights differ from the in-process actor's")
        items = rl_batch(processor)
        advantages = torch.linspace(1.0, -0.5, len(items))
        m_group = group.rl_step(items, advantages, preset("grpo"))
        m_one = one.rl_step(items, advantages, preset("grpo"))
        loss_gap = abs(m_group["pg_loss"] - m_one["pg_loss"])
        after = group.state_dict()
        weight_gap = max(float((after[k].cpu() - v.cpu()).abs().max()) for k, v in one.state_dict().items())
        if not (loss_gap <= TOLERANCE and weight_gap <= TOLERANCE):
            failures.append(f"one RL step: loss gap {loss_gap:.3g}, weight gap {weight_gap:.3g} (> {TOLERANCE})")
        return {"ok": not failures, "failures": failures, "group_start_s": round(start_s, 1), "layout": group.layout,
                "weights_bit_identical": identical, "loss_gap": loss_gap, "weight_gap": weight_gap,
                "memory": group.memory()}
    finally:
        if group is not None:
            group.close()
        if one is not None:
            one.close()
        if started:
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.trainer.tools.megatron_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--steps", type=int, default=3, help="megatron training steps (default 3)")
    parser.add_argument("--group", action="store_true",
                        help="check the rank-group launcher instead (world size 1 through Ray, as multi-GPU runs use)")
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch looks: the check runs on the CPU even on a GPU host
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "device": "cuda", "failures": ["no CUDA device visible to torch"]}))
        return 2
    try:
        summary = run_group_check(args.device) if args.group else run_check(args.device, args.steps)
    except Exception as exc:  # noqa: BLE001 - one JSON line whatever broke (the traceback on stderr)
        traceback.print_exc()
        summary = {"ok": False, "device": args.device, "failures": [f"{type(exc).__name__}: {exc}"]}
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
