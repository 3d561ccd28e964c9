"""One rank of a sharded Megatron actor: the megatron backend's step, split over tensor, pipeline and data ranks.

Every rank of a rank group (:mod:`~relax_gym.trainer.actors.megatron.group`) holds a :class:`RankActor` and gets
the same calls with the same arguments. What each rank does with them:

- **tensor parallel**: the same micro-batches on every tensor rank; megatron-core's parallel layers split each
  matrix and sum or gather the partial results. The vision and audio towers are replicated (their input -- the
  pixels, the audio features -- is the same on every tensor rank, and so are their gradients: the gradient of
  the merged embeddings reaches the towers whole), as Relax places them.
- **pipeline parallel**: the first stage holds the towers, the embedding and its decoder layers, the last stage
  the final norm and the head; a micro-batch goes through megatron-core's schedule
  (:func:`~relax_gym.trainer.actors.megatron.pipeline.pipeline_logprobs`). With tied embeddings the last stage's
  copy of the table gets the sum of both stages' gradients (megatron-core's embedding group), so the two copies
  take the same AdamW step and stay equal.
- **data parallel**: each micro-batch is split over the data-parallel ranks (rank ``d`` forwards items ``d``,
  ``d + dp``, ...). Each rank weights its part by its share of the *whole* batch, so the sum of the ranks'
  gradients -- one all-reduce of one flat buffer over the data-parallel group -- is the single-process gradient.
  Megatron-core's ``DistributedDataParallel`` is not used: its grad buffers only cover megatron-core modules
  (the towers are transformers modules) and its bucketed overlap brings nothing to a CPU; this reduction is
  the same sum, over every parameter, once per optimiser step.
- **gradient clipping**: by the norm of the whole model's gradient -- each tensor slice and pipeline stage counted
  once (replicated tensors on tensor rank 0 only, the tied copy of the table not at all), summed over the model
  parallel group -- so every rank clips by the same factor as one process would.

- **expert parallel**: megatron-core's all-gather token dispatcher (the one that builds on a CPU) gathers the
  tokens of the expert-parallel ranks into equal-sized buffers, so those ranks must forward batches of one shape:
  under ``ep > 1`` every data rank forwards the whole micro-batch instead of its share. A non-expert gradient is
  then the same on every data rank (averaged over them); an expert's (megatron-core marks its parameters
  ``allreduce = False``) already sums the tokens of every rank the dispatcher sent through it: divided by the
  data-parallel size and summed over the ranks that hold the same experts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from relax_gym.trainer.actors.megatron.actor import MegatronActor
from relax_gym.trainer.actors.megatron.model import gpt_of
from relax_gym.trainer.actors.megatron.pipeline import pipeline_logprobs
from relax_gym.trainer.actors.megatron.shard import tied_output_weight

__all__ = ["RankActor"]


class RankActor(MegatronActor):
    """A :class:`~relax_gym.trainer.actors.megatron.actor.MegatronActor` on one rank of a joined process group
    (:func:`~relax_gym.trainer.actors.megatron.runtime.join_group` first, or a launcher's group)."""

    SHARDED = True

    def __init__(self, model: torch.nn.Module, processor: Any, **kwargs: Any) -> None:
        super().__init__(model, processor, **kwargs)
        from megatron.core import parallel_state as ps

        self._ps = ps
        self.dp_rank, self.dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp = ps.get_pipeline_model_parallel_world_size()
        self.split = ps.get_expert_model_parallel_world_size() == 1  # data ranks share the batch out (see above)

    # -- which items this rank forwards, and how ------------------------------------------------------------------

    def _my_part(self, indices: Sequence[int]) -> list[int]:
        return list(indices)[self.dp_rank :: self.dp] if self.split else list(indices)

    def _forward_backward(self, chunk: Sequence[Any], temperature: float, loss_of: Any) -> torch.Tensor | None:
        if self.pp == 1:
            return super()._forward_backward(chunk, temperature, loss_of)
        lps, _ = pipeline_logprobs(self.model, self._collate(chunk), self._blocked, temperature, loss_of)
        return None if lps is None else lps.cpu()

    def forward_logprobs(self, items: Sequence[Any], temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """As the one-process actor's; across pipeline stages without gradients (training goes through
        :meth:`_forward_backward`), every stage answering the last stage's log-probs."""
        if self.pp == 1:
            return super().forward_logprobs(items, temperature)
        batch = self._collate(items)
        mask = batch["loss_mask"][:, 1:].float().cpu()
        with torch.no_grad():
            lps = self._from_last_stage(*pipeline_logprobs(self.model, batch, self._blocked, temperature, None))
        return lps, mask

    @torch.no_grad()
    def logprobs(self, items: Sequence[Any], temperature: float = 1.0) -> list[torch.Tensor]:
        """Every item's log-probs on every rank: each data rank scores its part, the last stage's answer is sent
        to the other stages, and the data ranks' parts are exchanged."""
        import torch.distributed as dist

        items = list(items)
        mine: dict[int, torch.Tensor] = {}
        for start in range(0, len(items), self.micro_batch_size):
            idx = self._my_part(range(start, min(start + self.micro_batch_size, len(items))))
            if not idx:
                continue
            lps, _ = self.forward_logprobs([items[i] for i in idx], temperature)
            mine.update(zip(idx, lps))
        if self.dp > 1 and self.split:
            parts: list[dict[int, torch.Tensor] | None] = [None] * self.dp
            dist.all_gather_object(parts, mine, group=self._ps.get_data_parallel_group())
            for part in parts:
                mine.update(part or {})
        return [mine[i] for i in range(len(items))]

    def _from_last_stage(self, lps: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
        """The last pipeline stage's log-probs (``shape``), on every stage (a broadcast over the pipeline group)."""
        import torch.distributed as dist

        ps = self._ps
        if lps is None:
            lps = torch.empty(shape, device=self.device)
        lps = lps.to(self.device).contiguous()
        dist.broadcast(lps, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
        return lps.cpu()

    # -- gradients over the ranks ----------------------------------------------------------------------------------

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _reduce_gradients(self) -> None:
        import torch.distributed as dist

        ps = self._ps
        params = self._params()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        dense = [p for p in params if getattr(p, "allreduce", True)]
        experts = [p for p in params if not getattr(p, "allreduce", True)]
        if self.dp > 1:
            _sum_flat(dense, ps.get_data_parallel_group())
            if not self.split:  # every data rank forwarded the whole batch: the mean, not the sum
                for p in dense:
                    p.grad.div_(self.dp)
        if experts:
            for p in experts:
                p.grad.div_(self.dp)  # each token reached its experts once per data rank that forwarded it
            if ps.get_expert_data_parallel_world_size() > 1:
                _sum_flat(experts, ps.get_expert_data_parallel_group())
        gpt = gpt_of(self.model)
        if self.pp > 1 and gpt.share_embeddings_and_output_weights and ps.is_rank_in_embedding_group():
            table = gpt.shared_embedding_or_output_weight()
            dist.all_reduce(table.grad, group=ps.get_embedding_group())

    def _clip_gradients(self) -> torch.Tensor:
        import torch.distributed as dist

        ps = self._ps
        gpt = gpt_of(self.model)
        tied = gpt.output_layer.weight if tied_output_weight(gpt) else None
        expert_parallel = ps.get_expert_model_parallel_world_size() > 1
        dense = torch.zeros((), dtype=torch.float64, device=self.device)
        experts = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self._params():
            if p.grad is None or p is tied:
                continue
            if expert_parallel and not getattr(p, "allreduce", True):  # this rank's own experts
                experts += p.grad.double().pow(2).sum()
            elif getattr(p, "tensor_model_parallel", False) or self.tp_rank == 0:
                dense += p.grad.double().pow(2).sum()
        dist.all_reduce(dense, group=ps.get_model_parallel_group())  # tensor slices and pipeline stages
        if expert_parallel:
            dist.all_reduce(experts, group=ps.get_expert_model_parallel_group())
            if self.pp > 1:
                dist.all_reduce(experts, group=ps.get_pipeline_model_parallel_group())
        norm = (dense + experts).sqrt().float()
        coef = torch.clamp(self.grad_clip / (norm + 1e-6), max=1.0)
        for p in self._params():
            if p.grad is not None:
                p.grad.mul_(coef.to(p.grad.dtype))
        return norm.cpu()

    def _sum_over_data(self, values: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        if self.dp == 1 or not self.split:  # unsplit: every data rank has the whole batch's sums already
            return values
        parts: list[dict[str, float] | None] = [None] * self.dp
        dist.all_gather_object(parts, dict(values), group=self._ps.get_data_parallel_group())
        out: dict[str, float] = {}
        for part in parts:
            for k, v in (part or {}).items():
                out[k] = out.get(k, 0.0) + v
        return out

    # -- checkpoints: every rank writes its shards, the processor once ---------------------------------------------

    def save_checkpoint(self, directory: Any) -> Any:
        from pathlib import Path

        import torch.distributed as dist
        from megatron.core import dist_checkpointing

        out = Path(directory)
        target = out / "megatron"
        target.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(self._sharded_state_dict(), str(target))
        if dist.get_rank() == 0:
            self.processor.save_pretrained(out)
        dist.barrier()
        return out


def _sum_flat(params: list[torch.nn.Parameter], group: Any) -> None:
    """Sum the gradients of ``params`` over ``group`` through one flat buffer."""
    import torch.distributed as dist

    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n
