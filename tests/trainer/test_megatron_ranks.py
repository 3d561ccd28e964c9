"""The megatron actor across ranks (a Ray rank group of two processes, gloo on loopback) against the same actor in
one process, from the same seed-0 weights, on one batch of rendered video / audio / image episodes:

- the gathered HF-named weights are bit-identical to the one-process actor's, and so is what an engine process
  receives of them over the DCS's tcp and disk transports (dense layouts: the engine serves the dense thinker);
- one RL step at tensor parallel 2, at pipeline parallel 2, at data parallel 2 and (the MoE thinker) at expert
  parallel 2 gives the one-process loss and gradient norm, and the same updated weights, within 1e-4 (AdamW,
  gradient clipping active; AdamW's first step may move an element whose gradient is at the noise floor further,
  see :func:`_assert_first_adamw_steps_agree`); so do the no-grad log-probs;
- a checkpoint written at that layout (weights and optimizer, ``dist_checkpointing``) loads into the one-process
  actor: the same weights exactly, and the next step from there equals the group's next step within 1e-4;
- a rank that dies fails the group as a whole, with one error naming the rank.
"""

from __future__ import annotations

import time

import pytest
import torch

from relax_gym.trainer.actors.factory import build_actor
from relax_gym.trainer.actors.megatron.actor import MegatronActor
from relax_gym.trainer.actors.megatron.group import RankGroupError, rank_actor_name
from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.run.seeds import seed_everything
from relax_gym.trainer.tools.megatron_check import TOLERANCE, rl_batch

LAYOUTS = {"tp2": {"tp": 2}, "pp2": {"pp": 2}, "dp2": {"dp": 2}, "ep2": {"dp": 2, "ep": 2}}  # ep2: the MoE thinker


def _config(parallel: dict[str, int]) -> RelaxConfig:
    family = "qwen3_omni_moe" if parallel.get("ep", 1) > 1 else "qwen2_5_omni"
    return RelaxConfig.model_validate({"model": {"family": family},
                                       "actor": {"backend": "megatron", "lr": 1e-3, "micro_batch_size": 4,
                                                 "grad_clip": 1.0, "parallel": parallel}})


def _one_process(cfg: RelaxConfig) -> MegatronActor:
    seed_everything(cfg.trainer.seed)
    model, processor = build_policy(cfg.model)
    return MegatronActor(model.train(), processor, lr=cfg.actor.lr, grad_clip=cfg.actor.grad_clip,
                         micro_batch_size=cfg.actor.micro_batch_size)


def _gaps(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every element's absolute difference between two state dicts with the same names, flat."""
    assert a.keys() == b.keys()
    return torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(_gaps(a, b).max())


def _assert_first_adamw_steps_agree(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], lr: float) -> None:
    """Weights after one AdamW step from the same start, at two layouts: equal within TOLERANCE but for at most 1 in
    100,000 elements, and those within 2 lr. AdamW's first step moves an element by lr * g / (|g| + eps): where the
    gradient is at the float noise floor (|g| ~ eps = 1e-8), the 1e-9 that another summation order makes (dp2 adds
    its ranks' gradients after the micro-batches, one process adds them in turn) moves that element by up to 2 lr;
    seen at dp2: one element of 32,768 in a gate projection, 1.16e-4 apart, every other within 3e-5."""
    gaps = _gaps(a, b)
    off = int((gaps > TOLERANCE).sum())
    assert off <= gaps.numel() // 100_000, f"{off} of {gaps.numel()} weights differ by more than {TOLERANCE}"
    assert float(gaps.max()) <= 2 * lr


@pytest.fixture(scope="module")
def engine():
    """An engine process that takes DCS pushes (one for every layout: each push replaces all its weights)."""
    from relax_gym.trainer.dcs.group import GroupReceiver
    from relax_gym.trainer.engines.process import spawn_engine
    from relax_gym.trainer.policy import PolicyConfig

    process = spawn_engine(PolicyConfig(seed=1), weight_receiver=GroupReceiver())
    yield process
    process.stop()


def _push_reaches_the_engine_bit_identical(group, expected_state: dict[str, torch.Tensor], engine) -> None:
    """Push the group's gathered weights to ``engine`` over tcp, then disk; the engine's SHA-256 of every tensor
    equals that of ``expected_state`` (what the one-process actor would push)."""
    from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, checkpoint_names
    from relax_gym.trainer.dcs.group import tensor_digest
    from relax_gym.trainer.engines.client import EngineClient

    names = checkpoint_names(group.hf_template)
    expected = {names[k]: tensor_digest(v) for k, v in expected_state.items()}
    with EngineClient(engine.url, timeout=60) as client:
        for transport in ("tcp", "disk"):
            version = int(client.get_weight_version() or 0) + 1
            coordinator = DCSCoordinator([engine.url], bucket_mb=0.25, transport=transport, version=version - 1)
            with DCSClient(coordinator, names=names) as dcs:
                assert dcs.push(group.state_dict(), version=version).engines == 1
            assert client.weights_checksum(list(expected)) == expected, transport


def _group(cfg: RelaxConfig, group_name: str | None = None):
    """A rank group of ``cfg``'s layout holding the seed-0 weights (those of :func:`_one_process`)."""
    seed_everything(cfg.trainer.seed)
    model, processor = build_policy(cfg.model)
    return build_actor(cfg, model, processor, group_name=group_name)


DEAD_RANK_GROUP = "dead-rank-test"


@pytest.fixture(scope="module")
def dp2_group(ray_session):
    """The data-parallel-2 group: its step is checked first, then one of its ranks is killed (one group start, ~12 s
    on a loaded machine, serves both tests)."""
    group = _group(_config(LAYOUTS["dp2"]), group_name=DEAD_RANK_GROUP)
    yield group
    group.close()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_step_across_ranks_equals_the_one_process_step(ray_session, tmp_path, engine, layout, request):
    cfg = _config(LAYOUTS[layout])
    one = _one_process(cfg)
    items = rl_batch(one.processor, per_env=2)  # 6 episodes, 3 groups; micro-batches of 4 and 2
    advantages = torch.tensor([1.0, -0.5, 0.75, -1.0, 0.25, -0.25])
    algo = preset("grpo")
    shared = layout == "dp2"  # the dead-rank test kills a rank of this group afterwards; its fixture closes it
    group = request.getfixturevalue("dp2_group") if shared else _group(cfg)
    try:
        assert [r["rank"] for r in group.layout] == [0, 1]
        start = group.state_dict()
        assert all(torch.equal(start[k], v) for k, v in one.state_dict().items()), "gathered weights differ"
        if cfg.model.family == "qwen2_5_omni":  # the engine process serves the dense thinker
            _push_reaches_the_engine_bit_identical(group, one.state_dict(), engine)
        scored, reference = group.logprobs(items), one.logprobs(items)  # no-grad scoring: all stages, all data ranks
        assert max(float((a - b).abs().max()) for a, b in zip(scored, reference)) <= TOLERANCE

        m_group = group.rl_step(items, advantages, algo)
        m_one = one.rl_step(items, advantages, algo)
        assert m_one["grad_norm"] > cfg.actor.grad_clip  # clipping is part of what must agree
        assert abs(m_group["grad_norm"] - m_one["grad_norm"]) <= TOLERANCE * m_one["grad_norm"]
        assert abs(m_group["pg_loss"] - m_one["pg_loss"]) <= TOLERANCE
        assert abs(m_one["pg_loss"]) > 10 * TOLERANCE  # the loss compared is not trivially zero
        after = group.state_dict()
        _assert_first_adamw_steps_agree(after, one.state_dict(), cfg.actor.lr)
        assert _max_gap(after, start) > 0.5 * cfg.actor.lr  # the step moved the weights (AdamW: by about lr)

        group.save_checkpoint(tmp_path)
        group.save_optimizer(tmp_path)
        resumed = _one_process(cfg)  # world size 1 reads the checkpoint written by two ranks
        try:
            resumed.load_checkpoint(tmp_path)
            resumed.load_optimizer(tmp_path)
            assert all(torch.equal(after[k], v) for k, v in resumed.state_dict().items())
            group.rl_step(items, -advantages, algo)
            resumed.rl_step(items, -advantages, algo)
            assert _max_gap(group.state_dict(), resumed.state_dict()) <= TOLERANCE
        finally:
            resumed.close()
    finally:
        if not shared:
            group.close()
        one.close()


def test_a_dead_rank_fails_the_whole_group_with_its_name(ray_session, dp2_group):
    group, ray = dp2_group, ray_session
    assert group.state_dict()  # alive and answering before the kill
    ray.kill(ray.get_actor(rank_actor_name(DEAD_RANK_GROUP, 1)), no_restart=True)
    with pytest.raises(RankGroupError, match="actor rank 1 of 2"):
        group.state_dict()  # rank 0 waits in a collective for rank 1: the group must not hang
    with pytest.raises(RankGroupError, match="actor rank 1 of 2"):
        group.set_lr(1e-4)  # failed for good
    deadline = time.monotonic() + 30  # ray.kill is asynchronous: wait until the names are gone
    while [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"{DEAD_RANK_GROUP}-rank")]:
        assert time.monotonic() < deadline, "a rank of the failed group is still alive"
        time.sleep(0.2)
