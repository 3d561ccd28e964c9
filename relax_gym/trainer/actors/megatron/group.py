"""The sharded Megatron actor as one object: a Ray rank group behind the actor surface of one process.

    group = RankGroup(spec, model, processor)  # world = tp * pp * dp processes, placed by a Ray placement group
    group.rl_step(items, advantages, algo)     # every rank gets the call; the answer is one rank's (see below)
    group.state_dict()                         # whole tensors under HF names, gathered from the ranks
    group.close()                              # the ranks end and the placement group is removed

Placement: one bundle per rank (``actor.parallel.num_cpus_per_rank`` CPUs, ``num_gpus_per_rank`` GPUs), packed on
as few nodes as possible. The ranks meet at a TCP store on rank 0: over loopback when every rank is on rank 0's
node (always, on one machine), at rank 0's node address otherwise. Each rank process
(:class:`RankWorker`) builds the same policy from the policy config (its weights come from ``model.seed``) and
converts it to its shard (:class:`~relax_gym.trainer.actors.megatron.rank_actor.RankActor`): gloo on a CPU, nccl on a GPU.

Answers: the log-probs, weights and checkpoints every rank agrees on come from rank 0; step metrics come from the
last rank (the last pipeline stage computes the loss; its data-parallel peers' sums are folded in); a streamed
micro-batch's rows are merged from all ranks (each data rank has its own items' rows).

Failure: the group fails as a whole. If any rank dies or raises, every rank is killed, the placement group is
removed and :class:`RankGroupError` names the rank and why; every later call raises it again. The async actor
role turns it into a level-2 restart (the run resumes from its last checkpoint with a new group).
"""

from __future__ import annotations

import copy
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from relax_gym.trainer.actors.megatron.runtime import ParallelSizes
from relax_gym.trainer.cluster.local_ray import start_local_ray
from relax_gym.trainer.policy import PolicyConfig

__all__ = ["RankGroup", "RankGroupError", "RankSpec", "RankWorker", "rank_actor_name"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to build its part of the actor (``build_actor`` makes it from the run's config)."""

    policy: PolicyConfig
    sizes: ParallelSizes
    optimizer: dict[str, Any] = field(default_factory=dict)  # lr, betas, weight_decay, grad_clip, micro_batch_size
    routing_replay: bool = False
    seed: int = 0  # megatron-core's model-parallel RNG tracker
    num_cpus_per_rank: float = 1.0
    num_gpus_per_rank: float = 0.0


class RankGroupError(RuntimeError):
    """A rank of the group died or failed: the group's training state is gone."""


def rank_actor_name(group_name: str, rank: int) -> str:
    """The Ray actor name of rank ``rank`` of the group ``group_name`` (fault injection finds ranks by it)."""
    return f"{group_name}-rank{rank}"


class RankWorker:
    """One rank's process (a Ray actor): joins the group, holds a :class:`RankActor`, runs the calls it gets."""

    def __init__(self, spec: RankSpec, rank: int, torch_threads: int) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        torch.set_num_threads(max(1, torch_threads))
        self.spec = spec
        self.rank = rank
        self.actor: Any = None

    def address(self) -> tuple[str, str, int]:
        """(node id, node address, a free port on it) for the group's store, when this is rank 0."""
        import ray

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), port

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group, build and shard the policy; answers this rank's place in the layout."""
        from megatron.core import parallel_state as ps

        from relax_gym.trainer.actors.megatron import runtime
        from relax_gym.trainer.actors.megatron.rank_actor import RankActor
        from relax_gym.trainer.policy import build_policy

        spec = self.spec
        runtime.join_group(spec.sizes, rank=self.rank, master_addr=master_addr, master_port=master_port, seed=spec.seed)
        model, processor = build_policy(spec.policy)
        self.actor = RankActor(model.train(), processor, parallel=spec.sizes, seed=spec.seed,
                               routing_replay=spec.routing_replay, **spec.optimizer)
        return {"rank": self.rank, "tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
                "dp": ps.get_data_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
                "parameters": sum(p.numel() for p in self.actor.model.parameters())}

    def call(self, method: str, packed: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        args, kwargs = packed  # Ray resolved the object reference the group sent: one stored copy for all ranks
        return getattr(self.actor, method)(*args, **kwargs)

    def memory(self) -> dict[str, float]:
        """This rank's peak resident memory (MiB) and the bytes of its parameters and optimizer state (MiB)."""
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        params = sum(p.numel() * p.element_size() for p in self.actor.model.parameters()) / 2**20
        state = sum(t.numel() * t.element_size() for s in self.actor.optimizer.state.values()
                    for t in s.values() if isinstance(t, torch.Tensor)) / 2**20
        return {"peak_rss_mib": peak, "params_mib": params, "optimizer_mib": state}

    def close(self) -> None:
        if self.actor is not None:
            self.actor.close()
            from relax_gym.trainer.actors.megatron import runtime

            runtime.release()  # join_group's own use
            self.actor = None


class RankGroup:
    """The megatron actor of ``spec`` as a Ray rank group. ``model``: this process's HF policy (built from the same
    policy config; it gives the names and config of the weights, and :meth:`hf_model` copies)."""

    def __init__(self, spec: RankSpec, model: torch.nn.Module, processor: Any, *, name: str | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world = spec.sizes.world
        self.processor = processor
        self.micro_batch_size = spec.optimizer.get("micro_batch_size", 32)
        self._template = model
        self._error: str | None = None
        self._started_ray = False
        if not ray.is_initialized():  # colocate mode: a local Ray for the ranks (Ray's own auth defaults)
            start_local_ray(num_cpus=max(os.cpu_count() or 1, int(self.world * spec.num_cpus_per_rank) + 1),
                            include_dashboard=False, log_to_driver=False, configure_logging=False, namespace="relax-gym")
            self._started_ray = True
        self.name = name or f"relax-actor-{os.getpid()}-{id(self):x}"
        bundle = {"CPU": spec.num_cpus_per_rank, **({"GPU": spec.num_gpus_per_rank} if spec.num_gpus_per_rank else {})}
        self._pg = placement_group([dict(bundle) for _ in range(self.world)], strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=300)
        except Exception as exc:
            remove_placement_group(self._pg)
            raise RankGroupError(f"the {self.world} rank(s) of actor.parallel do not fit the Ray cluster "
                                 f"({bundle} each): {type(exc).__name__}: {exc}") from exc
        remote = ray.remote(RankWorker)
        threads = max(1, int(spec.num_cpus_per_rank))
        self.workers = [
            remote.options(num_cpus=spec.num_cpus_per_rank, num_gpus=spec.num_gpus_per_rank,
                           name=rank_actor_name(self.name, r),
                           max_concurrency=2,  # a memory probe may come while a step runs
                           scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=r),
                           runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}})
            .remote(spec, r, threads)
            for r in range(self.world)]
        try:
            node, node_ip, port = self._wait([self.workers[0].address.remote()], "address")[0]
            nodes = self._wait([w.node.remote() for w in self.workers], "node")
            master = "127.0.0.1" if all(n == node for n in nodes) else node_ip
            self.layout = self._wait([w.setup.remote(master, port) for w in self.workers], "setup")
        except BaseException:
            self.close()
            raise

    # -- running calls on every rank ------------------------------------------------------------------------------

    def _wait(self, refs: list[Any], what: str) -> list[Any]:
        import ray

        if self._error is not None:
            raise RankGroupError(self._error)
        index = {ref: i for i, ref in enumerate(refs)}
        answers: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            try:
                answers[index[ref]] = ray.get(ref)
            except Exception as exc:  # a rank died or raised: the others may wait in a collective forever
                self._error = f"actor rank {index[ref]} of {self.world} failed in {what}: {type(exc).__name__}: {exc}"
                self._kill()
                raise RankGroupError(self._error) from exc
        return [answers[i] for i in range(len(refs))]

    def _all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        import ray

        if self._error is not None:
            raise RankGroupError(self._error)
        args_ref = ray.put((args, kwargs))  # one copy of a batch in the object store, not one per rank
        return self._wait([w.call.remote(method, args_ref) for w in self.workers], method)

    def check_health(self) -> None:
        """Raise :class:`RankGroupError` if the group failed or a rank is gone."""
        if self._error is not None:
            raise RankGroupError(self._error)
        self._wait([w.node.remote() for w in self.workers], "a health check")

    # -- the actor surface ---------------------------------------------------------------------------------------

    def set_lr(self, lr: float) -> None:
        self._all("set_lr", lr)

    def logprobs(self, items: Any, temperature: float = 1.0) -> list[torch.Tensor]:
        return self._all("logprobs", list(items), temperature)[0]

    def rl_step(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return self._all("rl_step", *args, **kwargs)[-1]

    def sft_step(self, items: Any) -> dict[str, float]:
        return self._all("sft_step", list(items))[-1]

    def begin_stream(self, total_weight: float | None = None) -> None:
        self._all("begin_stream", total_weight=total_weight)

    def stream_micro_batch(self, items: Any, *args: Any, **kwargs: Any) -> list[torch.Tensor | None]:
        answers = self._all("stream_micro_batch", list(items), *args, **kwargs)
        return [next((rows[i] for rows in answers if rows[i] is not None), None) for i in range(len(answers[0]))]

    def end_stream(self) -> dict[str, float]:
        return self._all("end_stream")[-1]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._all("state_dict")[0]

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self._all("load_weights", state)

    @property
    def hf_template(self) -> torch.nn.Module:
        return self._template

    def hf_model(self) -> torch.nn.Module:
        model = copy.deepcopy(self._template)
        model.load_state_dict({k: v.cpu() for k, v in self.state_dict().items()})
        return model.eval()

    def save_checkpoint(self, directory: str | Path) -> Path:
        self._all("save_checkpoint", str(directory))
        return Path(directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        self._all("load_checkpoint", str(directory))

    def save_optimizer(self, directory: str | Path) -> None:
        self._all("save_optimizer", str(directory))

    def load_optimizer(self, directory: str | Path) -> None:
        self._all("load_optimizer", str(directory))

    def memory(self) -> list[dict[str, float]]:
        """Each rank's peak resident memory and parameter / optimizer bytes (MiB), in rank order."""
        return self._wait([w.memory.remote() for w in self.workers], "memory")

    # -- the end ------------------------------------------------------------------------------------------------

    def _kill(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in getattr(self, "workers", []):
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                log.debug("killing a rank of %s failed", self.name, exc_info=True)
        self.workers = []
        if getattr(self, "_pg", None) is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - the cluster is going away
                log.debug("removing the placement group of %s failed", self.name, exc_info=True)
            self._pg = None

    def close(self) -> None:
        """End every rank (megatron-core's groups torn down where a rank still answers) and free the placement."""
        import ray

        if getattr(self, "workers", None) and self._error is None:
            try:
                ray.get([w.close.remote() for w in self.workers], timeout=60)
            except Exception:  # noqa: BLE001 - a rank that cannot close cleanly is killed below
                log.debug("a rank of %s did not close cleanly", self.name, exc_info=True)
        self._kill()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
