"""Per-token advantages (PPO's GAE) in the actor's step: rows equal to a per-item advantage give exactly the per-item
step; a row that is non-zero on one token moves that token alone; an all-zero row is not forwarded; both backends
(hf, megatron in one process) take the same step on per-token rows."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import relax_gym
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.run.warmup import demonstration


@pytest.fixture(scope="module")
def pair():
    """Two answers to one prompt that differ only in the answer letter, and the position of that letter."""
    _, processor = build_policy()
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    good = demonstration(env, processor, 0, rng)
    bad = demonstration(env, processor, 0, rng)
    while bad.input_ids == good.input_ids:
        bad = demonstration(env, processor, 0, rng)
    env.close()
    pos = next(i for i, (a, b) in enumerate(zip(good.input_ids, bad.input_ids)) if a != b)
    items = [Trajectory(group_id=0, seed=0, input_ids=r.input_ids, loss_mask=r.loss_mask,
                        rollout_logprobs=[0.0] * len(r.input_ids), mm=r.mm) for r in (good, bad)]
    return items, pos


def actors(n: int, cls=HFActor, **kwargs):
    model, processor = build_policy()
    out = [cls(copy.deepcopy(model), processor, lr=1.0, micro_batch_size=1, **kwargs) for _ in range(n)]
    for actor in out:  # plain SGD: parameters move by exactly the gradient
        actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=1e-2)
    return out


def rows_of(items, values):
    """Per-token rows (aligned with log-probs: length len(input_ids) - 1) holding ``values[i]`` on every trained
    token of item i and garbage elsewhere (never read: the loss masks it)."""
    out = []
    for it, v in zip(items, values):
        mask = torch.tensor(it.loss_mask[1:], dtype=torch.bool)
        out.append(torch.where(mask, torch.tensor(float(v)), torch.tensor(123.0)))
    return out


@pytest.mark.parametrize("name", ["grpo", "ppo"])  # seq_mean_token_mean and token_mean aggregation
def test_rows_equal_to_a_per_item_advantage_give_the_per_item_step(pair, name):
    items, _ = pair
    per_item, per_token = actors(2)
    algo = preset(name)
    m_item = per_item.rl_step(items, torch.tensor([1.0, -0.5]), algo)
    m_token = per_token.rl_step(items, rows_of(items, [1.0, -0.5]), algo)
    for (key, a), b in zip(per_item.model.named_parameters(), per_token.model.parameters()):
        assert torch.equal(a, b), key
    assert m_token["pg_loss"] == m_item["pg_loss"] and m_token["grad_norm"] == m_item["grad_norm"] > 0


def test_a_row_moves_only_the_tokens_it_names(pair):
    items, pos = pair
    (actor,) = actors(1)
    rows = [torch.zeros(len(it.input_ids) - 1) for it in items]
    rows[0][pos - 1] = 1.0  # only the answer letter of the first answer; the second item's row is all zero

    def lps():
        return [row.clone() for row in actor.logprobs(items)]

    before = lps()
    m = actor.rl_step(items, rows, preset("ppo"))
    after = lps()
    assert m["samples_forwarded"] == 1.0  # the all-zero row carries no signal: not forwarded
    assert after[0][pos - 1] > before[0][pos - 1]
    with pytest.raises(ValueError, match="1 advantages"):
        actor.begin_stream()
        actor.stream_micro_batch(items, rows[:1], preset("ppo"))


def test_the_megatron_backend_takes_the_same_step_on_per_token_rows(pair):
    pytest.importorskip("megatron.core")
    from relax_gym.trainer.actors.megatron.actor import MegatronActor

    items, _ = pair
    model, processor = build_policy()
    hf = HFActor(copy.deepcopy(model), processor, lr=1.0, micro_batch_size=1)
    mc = MegatronActor(copy.deepcopy(model), processor, lr=1.0, micro_batch_size=1)
    try:
        for actor in (hf, mc):
            actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=1e-2)
        rows = [torch.linspace(-1, 1, len(it.input_ids) - 1) for it in items]
        m_hf = hf.rl_step(items, rows, preset("ppo"))
        m_mc = mc.rl_step(items, rows, preset("ppo"))
        assert m_mc["grad_norm"] > 0 and m_mc["grad_norm"] == pytest.approx(m_hf["grad_norm"], rel=1e-4)
        assert m_mc["pg_loss"] == pytest.approx(m_hf["pg_loss"], abs=1e-5)
        hf_after, mc_after = hf.state_dict(), mc.state_dict()
        assert max(float((hf_after[k] - mc_after[k]).abs().max()) for k in hf_after) <= 1e-5
    finally:
        mc.close()
