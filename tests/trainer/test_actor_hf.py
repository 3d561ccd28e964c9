"""The hf actor: SFT on format demonstrations lowers the NLL; an RL step moves log-probs the way advantages say."""

from __future__ import annotations

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.actor_hf import HFActor
from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.demonstrations import demonstration
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.rollout import Trajectory


def test_demonstrations_teach_format_not_labels():
    _, processor = build_policy()
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    letters = set()
    for seed in range(12):
        r = demonstration(env, processor, seed, rng)
        text = processor.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m], skip_special_tokens=True)
        assert text.startswith("<think>I look.</think><answer>") and text.endswith("</answer>")
        letters.add(text[-10])
    assert len(letters) >= 3  # random letters, not the gold ones


def test_sft_steps_reduce_nll():
    torch.manual_seed(0)
    model, processor = build_policy()
    actor = HFActor(model, processor, lr=1e-3, micro_batch_size=8)
    env = relax_gym.make("echo-ink")
    rng = np.random.default_rng(0)
    batch = [demonstration(env, processor, s, rng) for s in range(16)]
    first = actor.sft_step(batch)["sft_nll"]
    for _ in range(15):
        last = actor.sft_step(batch)["sft_nll"]
    assert last < first * 0.7


def test_rl_step_raises_logprob_of_positive_advantage_sequence():
    torch.manual_seed(0)
    model, processor = build_policy()
    actor = HFActor(model, processor, lr=5e-3, micro_batch_size=1)  # micro-batches of 1: accumulation path
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    good, bad = demonstration(env, processor, 0, rng), demonstration(env, processor, 0, rng)
    items = []
    for r in (good, bad):
        items.append(Trajectory(group_id=0, seed=0, input_ids=r.input_ids, loss_mask=r.loss_mask,
                                rollout_logprobs=[0.0] * len(r.input_ids), mm=r.mm))
    before = [lp[m.bool()].sum() for lp, m in zip(actor.logprobs(items), [torch.tensor(i.loss_mask[1:]) for i in items])]
    m = actor.rl_step(items, torch.tensor([1.0, -1.0]), preset("grpo"))
    after = [lp[m_.bool()].sum() for lp, m_ in zip(actor.logprobs(items), [torch.tensor(i.loss_mask[1:]) for i in items])]
    assert after[0] > before[0] and after[1] < before[1]
    assert m["grad_norm"] > 0 and "mismatch_kl" in m
