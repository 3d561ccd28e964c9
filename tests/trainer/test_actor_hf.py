"""The hf actor: SFT on format demonstrations lowers the NLL; an RL step moves log-probs the way advantages say."""

from __future__ import annotations

import copy

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.run.warmup import demonstration
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.rollout.episode import Trajectory


def test_demonstrations_teach_format_not_labels():
    _, processor = build_policy()
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    letters = set()
    for seed in range(12):
        r = demonstration(env, processor, seed, rng)
        text = processor.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m], skip_special_tokens=True)
        assert text.startswith("<think></think><answer>") and text.endswith("</answer>")
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
    for _ in range(3):  # measured: the NLL is at 0.67, 0.40, 0.25 of the first after 1, 2, 3 more steps
        last = actor.sft_step(batch)["sft_nll"]
    assert last < first * 0.7


def test_rl_step_moves_the_decision_token_the_way_advantages_say():
    """Two answers to one prompt that differ only in the letter: +1 / -1 advantages must make the first letter
    more likely and the second less likely (through the micro-batch accumulation path)."""
    torch.manual_seed(0)
    model, processor = build_policy()
    actor = HFActor(model, processor, lr=1e-3, micro_batch_size=1)
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    good = demonstration(env, processor, 0, rng)
    bad = demonstration(env, processor, 0, rng)
    while bad.input_ids == good.input_ids:  # same prompt, a different (random) answer letter
        bad = demonstration(env, processor, 0, rng)
    pos = next(i for i, (a, b) in enumerate(zip(good.input_ids, bad.input_ids)) if a != b)
    items = [Trajectory(group_id=0, seed=0, input_ids=r.input_ids, loss_mask=r.loss_mask,
                        rollout_logprobs=[0.0] * len(r.input_ids), mm=r.mm) for r in (good, bad)]

    def letter_logprobs():
        lps = actor.logprobs(items)
        return float(lps[0][pos - 1]), float(lps[1][pos - 1])  # log-prob of the token at `pos`

    before = letter_logprobs()
    m = actor.rl_step(items, torch.tensor([1.0, -1.0]), preset("grpo"))
    after = letter_logprobs()
    assert after[0] > before[0] and after[1] < before[1]
    assert m["grad_norm"] > 0 and m["mismatch_kl"] > 0  # rollout log-probs were zeros: a visible mismatch


def test_logprobs_on_loss_positions_equal_a_full_forward():
    """The head runs only where the loss reads; those log-probs equal a plain full-logits forward (right-padded
    batch of different lengths, media included), and every other position is 0."""
    from relax_gym.trainer.algorithms import token_logprobs

    torch.manual_seed(0)
    model, processor = build_policy()
    actor = HFActor(model, processor, lr=1e-3, micro_batch_size=4)
    rng = np.random.default_rng(0)
    items = [demonstration(relax_gym.make(env_id), processor, s, rng) for s, env_id in enumerate(["nextqa-video", "echo-ink", "nextqa-video"])]
    with torch.no_grad():
        lps, mask = actor.forward_logprobs(items, temperature=0.7)
        for i, r in enumerate(items):
            batch = processor.collate([r], padding_side="right")
            batch.pop("loss_mask")
            logits = model(**batch).logits[0, :-1]
            logits[:, sorted(processor.control_token_ids)] = float("-inf")
            full = token_logprobs(logits, torch.tensor(r.input_ids[1:]), temperature=0.7)
            on = torch.tensor(r.loss_mask[1:], dtype=torch.bool)
            n = len(r.input_ids) - 1
            assert mask[i, :n].bool().equal(on) and int(mask[i, n:].sum()) == 0
            torch.testing.assert_close(lps[i, :n][on], full[on], atol=1e-5, rtol=0)
            assert float(lps[i][~mask[i].bool()].abs().sum()) == 0.0


def test_zero_advantage_samples_are_skipped_without_changing_the_step():
    """Samples with advantage exactly 0 are not forwarded, yet the update equals the one where they are (a 1e-30
    advantage forces the forward): their share stays in the loss normaliser."""
    torch.manual_seed(0)
    model, processor = build_policy()
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    demos = [demonstration(env, processor, s, rng) for s in (0, 0, 1, 2)]
    items = [Trajectory(group_id=0, seed=0, input_ids=r.input_ids, loss_mask=r.loss_mask,
                        rollout_logprobs=[0.0] * len(r.input_ids), mm=r.mm) for r in demos]
    results = []
    for tiny in (0.0, 1e-30):
        m = copy.deepcopy(model)
        actor = HFActor(m, processor, lr=1e-3, micro_batch_size=2)
        metrics = actor.rl_step(items, torch.tensor([1.0, tiny, -1.0, tiny]), preset("grpo"))
        results.append((metrics["samples_forwarded"], [p.detach().clone() for p in m.parameters()]))
    assert results[0][0] == 2 and results[1][0] == 4
    for a, b in zip(results[0][1], results[1][1]):
        # micro-batches pad differently: float noise only, which Adam can blow up to ~1e-5 on an element whose
        # gradient is ~0; a changed normaliser would move every element by ~lr (1e-3)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
