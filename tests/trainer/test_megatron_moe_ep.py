"""Expert parallel 2 on a CPU: the Qwen3-Omni MoE thinker's megatron actor in 2 processes (gloo over loopback),
checked against the same actor in this process with expert parallel 1.

The harness starts 2 processes (``torch.multiprocessing.spawn``) that join one gloo group through a TCP store on
127.0.0.1 (a free port; ``GLOO_SOCKET_IFNAME=lo``) and set up megatron-core with tensor = pipeline = 1 and
expert_model_parallel_size = 2: data parallel 2, and expert parallel 2 carved out of it, so rank r holds experts
4r .. 4r+3 of each layer. As a launcher would, the harness sets up megatron-core's parallel state before it builds the
actor (a :class:`~relax_gym.trainer.actors.megatron.rank_actor.RankActor`, as each rank of a rank group holds); the
actor's runtime then uses it as it is. Both ranks get the same batch (the demonstration episodes) and, under expert
parallel, both forward all of it (the all-gather dispatcher needs equal token counts), so the mean of the two ranks'
losses is the one-process loss:

- log-probs: every rank's equal the one-process ones (within 1e-4); tokens of both ranks pass through the experts of
  both ranks (the all-gather dispatcher), so a wrong expert placement or a lost reduce-scatter would show;
- HF-named weights: gathered from both ranks, they equal the HF thinker's bit for bit;
- one RL step (plain SGD, gradient clipping at 1.0 active): non-expert gradients averaged over the data-parallel
  group, expert gradients divided by the data-parallel size (each already sums both ranks' tokens), the clip by the
  global norm (``RankActor._reduce_gradients`` / ``_clip_gradients``): the same loss, gradient norm and updated
  weights as expert parallel 1 (within 1e-4).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.tools.megatron_check import demonstration_batch

pytestmark = pytest.mark.timeout(600)

WORLD = 2
CFG = PolicyConfig(family="qwen3_omni_moe")  # 8 experts: 4 per rank
ADVANTAGES = [1.0, -1.0, 0.5]


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(processor):
    items = demonstration_batch(processor, per_env=1)
    return [Trajectory(group_id=i, seed=i, input_ids=list(it.input_ids), loss_mask=list(it.loss_mask),
                       rollout_logprobs=[0.0] * len(it.input_ids), mm=it.mm) for i, it in enumerate(items)]


def _run_actor(actor, items) -> dict:
    """What both runs report: log-probs, HF-named weights before and after one RL step, the step's metrics."""
    actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=1e-2)
    with torch.no_grad():
        lps, mask = actor.forward_logprobs(items)
    before = {k: v.clone() for k, v in actor.state_dict().items()}
    metrics = actor.rl_step(items, torch.tensor(ADVANTAGES), preset("grpo"))
    after = {k: v.clone() for k, v in actor.state_dict().items()}
    return {"logprobs": lps, "mask": mask, "before": before, "after": after, "metrics": metrics}


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(1)
    import torch.distributed as dist
    from megatron.core import parallel_state

    from relax_gym.trainer.actors.megatron.cpu_patch import apply_cpu_patch
    from relax_gym.trainer.actors.megatron.rank_actor import RankActor
    from relax_gym.trainer.actors.megatron.runtime import ParallelSizes

    apply_cpu_patch()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                                 expert_model_parallel_size=WORLD)
        assert parallel_state.get_data_parallel_world_size() == WORLD
        assert parallel_state.get_expert_model_parallel_rank() == rank
        model, processor = build_policy(CFG)
        actor = RankActor(model, processor, lr=1e-3, micro_batch_size=2,
                          parallel=ParallelSizes(data=WORLD, expert=WORLD))  # the layout made above
        try:
            held = list(actor.model.model.language_model.gpt.decoder.layers[0].mlp.local_expert_indices)
            result = _run_actor(actor, _batch(processor))
            result["held_experts"] = held
            torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        finally:
            actor.close()
        parallel_state.destroy_model_parallel()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ep1_reference():
    """The same model, batch and step in this process (expert parallel 1), and the HF thinker's weights."""
    from relax_gym.trainer.actors.megatron.actor import MegatronActor

    hf_model, _ = build_policy(CFG)
    model, processor = build_policy(CFG)
    actor = MegatronActor(model, processor, lr=1e-3, micro_batch_size=2)
    try:
        return _run_actor(actor, _batch(processor)), hf_model.state_dict()
    finally:
        actor.close()


@pytest.fixture(scope="module")
def ep2_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep2")
    mp.spawn(_worker, args=(_free_loopback_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_each_rank_holds_its_block_of_experts(ep2_results):
    assert [r["held_experts"] for r in ep2_results] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_expert_parallel_logprobs_and_gathered_weights_equal_one_process(ep1_reference, ep2_results):
    ref, hf_weights = ep1_reference
    where = ref["mask"].bool()
    assert where.sum() > 30
    for res in ep2_results:
        assert float((res["logprobs"] - ref["logprobs"])[where].abs().max()) <= 1e-4
        assert list(res["before"]) == list(hf_weights)
        assert all(torch.equal(res["before"][k], hf_weights[k]) for k in hf_weights)  # every expert, gathered


def test_expert_parallel_rl_step_equals_one_process(ep1_reference, ep2_results):
    ref, _ = ep1_reference
    assert ref["metrics"]["grad_norm"] > 1.0  # clipping at 1.0 is active: the global norm must be right
    for res in ep2_results:
        m = res["metrics"]
        assert abs(m["pg_loss"] - ref["metrics"]["pg_loss"]) <= 1e-4
        assert abs(m["grad_norm"] - ref["metrics"]["grad_norm"]) <= 1e-4 * ref["metrics"]["grad_norm"]
        diff = {k: float((res["after"][k] - ref["after"][k]).abs().max()) for k in ref["after"]}
        assert max(diff.values()) <= 1e-4, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    moved = [k for k in ref["after"] if "experts" in k and not torch.equal(ref["after"][k], ref["before"][k])]
    assert moved  # the experts learned in the step being compared
