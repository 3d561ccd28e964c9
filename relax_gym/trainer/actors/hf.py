"""The ``hf`` actor backend: plain torch training of a transformers policy (CPU default, GPU when present).

One job: turn batches of trajectories into optimiser steps. It computes token log-probs with the sampler's
temperature and with the tokens the sampler may never emit (media pads, pad) masked to -inf, so training and
rollout log-probs describe the same distribution; it splits a batch into micro-batches and weights each one's
loss by its share of the batch (tokens for token-level aggregation, sequences otherwise), so gradient
accumulation gives the same step as one big batch.

MoE policies: items may carry the experts their rollout routed each token to (``routed_experts``). Every training
forward then measures the routing mismatch (the router's own top-k vs the record, per layer); with
``routing_replay`` (R3) the forward runs under :func:`~relax_gym.trainer.policy.routers.replay_routing` and uses the
recorded experts, their weights recomputed from this forward's router logits. The step metrics report
``routing_mismatch`` (+ ``_l{i}`` per layer) and ``routing_mismatch_used`` (0 under replay).

Advantages come per item (a ``[B]`` tensor: GRPO and friends, one number for every token of an episode) or per
token (a list of 1-D tensors, one per item, aligned with the log-probs: entry ``t`` belongs to token ``t + 1``;
PPO's GAE advantages, :mod:`~relax_gym.trainer.algorithms.gae`). The loss is the same clipped surrogate either
way (``policy_loss`` takes ``[B]`` or ``[B, T]``); the per-item path is unchanged by the per-token one.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import torch

from relax_gym.trainer.algorithms import AlgorithmConfig, policy_loss_of, sft_loss, token_logprobs
from relax_gym.trainer.policy.model import save_policy
from relax_gym.trainer.policy.routers import moe_routers, replay_routing, routing_shape
from relax_gym.trainer.policy.routing import RoutingCounts, batch_routing

#: One advantage per item (``[B]``), or one row of per-token advantages per item (aligned with its log-probs).
Advantages: TypeAlias = "torch.Tensor | Sequence[torch.Tensor]"


class HFActor:
    def __init__(self, model, processor, *, lr: float, betas=(0.9, 0.99), weight_decay: float = 0.0,
                 grad_clip: float = 1.0, micro_batch_size: int = 32, routing_replay: bool = False) -> None:
        self.model = model
        self.routing = routing_shape(model) if moe_routers(model) else None  # (MoE layers, top_k)
        if routing_replay and self.routing is None:
            raise ValueError(f"algorithm.routing_replay needs a mixture-of-experts policy; {type(model).__name__} is dense "
                             "(set model.family=qwen3_omni_moe)")
        self.routing_replay = routing_replay
        self.routing_counts = RoutingCounts()
        self.processor = processor
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=betas, weight_decay=weight_decay)
        self._blocked = torch.tensor(sorted(processor.control_token_ids), dtype=torch.long)
        self._stream_total: float | None = None  # a streamed step's state (see begin_stream)
        self._stream_weight = self._stream_live = 0.0
        self._stream_forwarded = 0
        self._stream_totals: dict[str, float] = {}

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # -- log-probs ----------------------------------------------------------------------------------------

    def forward_logprobs(self, items: Sequence[Any], temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (B, T-1) of each next token, loss mask (B, T-1)) for a micro-batch of rendered sequences.

        Only the positions the loss reads (mask 1) get log-probs; the others hold 0. The output head runs on
        those positions alone when the model exposes its body and head (``model.model`` / ``model.lm_head``, as
        transformers' causal LMs do): a completion is a few tokens of a long multimodal prompt, so this skips
        almost all of the (tokens x vocabulary) logits."""
        batch = self._collate(items)
        mask = batch.pop("loss_mask")[:, 1:]
        targets = batch["input_ids"][:, 1:]
        where = mask.bool()
        body, head = getattr(self.model, "model", None), getattr(self.model, "lm_head", None)
        with self._routing(items, batch):
            if body is not None and head is not None:
                hidden = body(**batch, use_cache=False)[0][:, :-1]
                logits = head(hidden[where])
            else:
                logits = self.model(**batch).logits[:, :-1][where]
        lps = masked_logprobs(logits, targets, where, self._blocked, temperature)
        return lps.cpu(), mask.to(lps.dtype).cpu()

    def _collate(self, items: Sequence[Any]) -> dict[str, Any]:
        """A right-padded micro-batch on the model's device (a GPU model: the forward runs there, the loss on the CPU)."""
        return collate_on(self.model, self.processor, items)

    @contextlib.contextmanager
    def _routing(self, items: Sequence[Any], batch: dict[str, torch.Tensor]):
        """Around one forward: replay (or only trace) the items' recorded routing and count the mismatch."""
        records = [getattr(it, "routed_experts", None) for it in items]
        if self.routing is None or all(r is None for r in records):
            yield
            return
        ids = batch["input_ids"]
        recorded = batch_routing(records, ids.shape[1], *self.routing)
        with self._replay_routing(recorded if self.routing_replay else None, ids.shape[0]) as trace:
            yield
        self.routing_counts.add(recorded, trace.natural, trace.used, batch["attention_mask"].bool())

    def _replay_routing(self, recorded: torch.Tensor | None, rows: int) -> Any:
        """The context that forces ``recorded`` (None: only traces) on this backend's routers for one forward."""
        return replay_routing(self.model, recorded, batch=rows)

    def _routing_metrics(self) -> dict[str, float]:
        metrics, self.routing_counts = self.routing_counts.metrics(), RoutingCounts()
        return metrics

    @torch.no_grad()
    def logprobs(self, items: Sequence[Any], temperature: float = 1.0) -> list[torch.Tensor]:
        out = []
        for chunk in _chunks(list(items), self.micro_batch_size):
            lps, _ = self.forward_logprobs(chunk, temperature)
            out += [row for row in lps]
        return out

    # -- steps --------------------------------------------------------------------------------------------

    def rl_step(self, items: Sequence[Any], advantages: Advantages, algo: AlgorithmConfig,
                ref_logprobs: list[torch.Tensor] | None = None, epochs: int = 1) -> dict[str, float]:
        """One RL update on ``items`` (objects with input_ids, loss_mask, mm, rollout_logprobs), ``epochs`` passes:
        the streamed step (:meth:`begin_stream`, :meth:`stream_micro_batch` per micro-batch, :meth:`end_stream`) on
        a batch known in full, so each micro-batch is weighted by its share of the whole batch up front — the one
        loss path of both trainer modes. ``advantages``: one per item, or one per-token row per item (see the
        module docstring)."""
        items = list(items)
        old = self.logprobs(items, algo.temperature) if epochs > 1 else None
        total = sum(self._raw_weights(items, algo.aggregation)) or 1.0
        # A zero-advantage sample adds nothing to the policy-gradient loss (and, without a KL term, to the
        # gradient): its share still counts in the normaliser, so leaving it out of the forward pass gives the same
        # step for less compute (all-equal groups, and losers under negative_advantage_scale=0).
        live = [i for i in range(len(items)) if algo.kl_coef > 0 or _has_signal(advantages, i)]
        metrics: dict[str, float] = {}
        for _ in range(epochs):
            self.begin_stream(total_weight=total)
            for idx in _chunks(live, self.micro_batch_size):
                self.stream_micro_batch([items[i] for i in idx], _take(advantages, idx), algo,
                                        ref_logprobs=[ref_logprobs[i] for i in idx] if ref_logprobs is not None else None,
                                        old_logprobs=[old[i] for i in idx] if old is not None else None)
            metrics = self.end_stream()
        return metrics

    def sft_step(self, items: Sequence[Any]) -> dict[str, float]:
        items = list(items)
        self.optimizer.zero_grad(set_to_none=True)
        weights = self._shares(items, "token_mean")
        nll = [0.0]
        for idx in _chunks(list(range(len(items))), self.micro_batch_size):
            mine = self._my_part(idx)
            if not mine:
                continue
            share = sum(weights[i] for i in mine)

            def loss_of(lps: torch.Tensor, mask: torch.Tensor, share: float = share) -> torch.Tensor:
                out = sft_loss(lps, mask)
                nll[0] += out.metrics["nll"] * share
                return out.loss * share

            self._forward_backward([items[i] for i in mine], 1.0, loss_of)
        self._reduce_gradients()
        grad_norm = self._clip_gradients()
        self._step_and_free_gradients()
        return {"sft_nll": self._sum_over_data({"sft_nll": nll[0]})["sft_nll"], "grad_norm": float(grad_norm)}

    def _step_and_free_gradients(self) -> None:
        """The optimiser step, then the gradients freed: they are spent, and held until the next step's start they
        would sit beside everything between two steps -- the weight push's copy, the evaluation, the checkpoint --
        a whole policy's worth of memory (1.6 GB for the 0.8 B-parameter thinker of Qwen2.5-Omni-3B in bf16)."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- what a sharded actor changes (actors/megatron/rank_actor.py); one process does nothing here ----------------

    def _my_part(self, indices: Sequence[int]) -> list[int]:
        """Which of a micro-batch's items this process forwards (a data-parallel rank: its share)."""
        return list(indices)

    def _forward_backward(self, chunk: Sequence[Any], temperature: float, loss_of: Any) -> torch.Tensor | None:
        """Forward ``chunk``, ``loss_of(logprobs, mask)`` -> the scalar to backpropagate, backward; the log-probs
        (None where this process does not see them: an earlier pipeline stage)."""
        lps, mask = self.forward_logprobs(chunk, temperature)
        loss_of(lps, mask).backward()
        return lps.detach()

    def _reduce_gradients(self) -> None:
        """Make the accumulated gradients the whole batch's (data-parallel ranks sum theirs)."""

    def _clip_gradients(self) -> torch.Tensor:
        """Clip the gradients to ``grad_clip`` by their global norm; returns that norm."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)

    def _sum_over_data(self, values: dict[str, float]) -> dict[str, float]:
        """Per-process sums (metrics weighted by loss share) summed over the data-parallel ranks."""
        return values

    @staticmethod
    def _shares(items: Sequence[Any], aggregation: str) -> list[float]:
        if aggregation == "token_mean":
            tokens = [sum(it.loss_mask[1:]) for it in items]
            total = sum(tokens) or 1
            return [t / total for t in tokens]
        valid = [1.0 if sum(it.loss_mask[1:]) > 0 else 0.0 for it in items]
        total = sum(valid) or 1.0
        return [v / total for v in valid]

    # -- streaming steps: micro-batches trained as they arrive, one optimiser step at the end -------------------

    def begin_stream(self, total_weight: float | None = None) -> None:
        """Start a streamed step: gradients are accumulated by :meth:`stream_micro_batch` until :meth:`end_stream`.
        ``total_weight``: the whole batch's raw loss weight when it is known up front (:meth:`rl_step`); each
        micro-batch is then weighted by its share of it directly, instead of dividing the summed gradients at the end."""
        self.optimizer.zero_grad(set_to_none=True)
        self._stream_total = total_weight
        self._stream_weight = 0.0  # every sample's raw share: the normaliser
        self._stream_live = 0.0  # the forwarded samples' share: the metrics' normaliser
        self._stream_forwarded = 0
        self._stream_totals: dict[str, float] = {}
        self.routing_counts = RoutingCounts()

    def stream_micro_batch(self, items: Sequence[Any], advantages: Advantages, algo: AlgorithmConfig, *,
                           ref_logprobs: list[torch.Tensor] | None = None,
                           old_logprobs: list[torch.Tensor | None] | None = None,
                           tis_cap: float | None = None) -> list[torch.Tensor | None]:
        """Forward and backward one micro-batch of a streamed step; returns its log-probs (detached, one row per
        item, None for an item that was not forwarded), the old log-probs of any later epoch over the same data.

        The batch size is not known while data still arrives, so each micro-batch's loss is weighted by its raw
        share (its tokens for ``token_mean``, its valid sequences otherwise) and :meth:`end_stream` divides the
        summed gradients by the total: the same step as :meth:`rl_step` on the whole batch. As there, a
        zero-advantage sample is not forwarded unless a KL term needs it, but its share stays in the total.
        ``tis_cap`` overrides ``algo.tis_cap`` (the async engine's cap for stale samples); with a cap the rollout
        log-probs weight the policy gradient (truncated importance sampling). ``advantages``: one per item, or one
        per-token row per item (see the module docstring)."""
        items = list(items)
        if len(advantages) != len(items):
            raise ValueError(f"{len(advantages)} advantages (or advantage rows) for {len(items)} items")
        raw = self._raw_weights(items, algo.aggregation)
        self._stream_weight += sum(raw)
        live = [i for i in range(len(items)) if algo.kl_coef > 0 or _has_signal(advantages, i)]
        out_rows: list[torch.Tensor | None] = [None] * len(items)
        total = self._stream_total
        shares = [r if total is None else r / total for r in raw]
        weight = sum(shares[i] for i in live)
        if not live or weight == 0:
            return out_rows
        self._stream_live += weight
        self._stream_forwarded += len(live)
        mine = self._my_part(live)  # every item in one process; a data-parallel rank's share of them
        if not mine:
            return out_rows
        my_weight = sum(shares[i] for i in mine)
        chunk = [items[i] for i in mine]
        kwargs = algo.loss_kwargs()
        loss_fn = policy_loss_of(algo.policy_loss)  # the registered loss the algorithm names (clipped surrogate)
        if tis_cap is not None:
            kwargs["tis_cap"] = tis_cap
        totals = self._stream_totals

        def loss_of(lps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            shape = lps.shape
            old = lps.detach() if old_logprobs is None else _stack([old_logprobs[i] for i in mine], shape)
            rollout = _stack([torch.tensor(it.rollout_logprobs[1:], dtype=lps.dtype) for it in chunk], shape)
            ref = _stack([ref_logprobs[i] for i in mine], shape) if ref_logprobs is not None else None
            out = loss_fn(lps, old, _advantage_matrix(advantages, mine, shape), mask, ref_logprobs=ref,
                              rollout_logprobs=rollout if kwargs.get("tis_cap") else None, **kwargs)
            for k, v in out.metrics.items():
                totals[k] = totals.get(k, 0.0) + v * my_weight
            totals["mismatch_kl"] = totals.get("mismatch_kl", 0.0) + my_weight * _mismatch(lps.detach(), rollout, mask)
            return out.loss * my_weight

        lps = self._forward_backward(chunk, algo.temperature, loss_of)
        if lps is not None:
            for i, row in zip(mine, lps):
                out_rows[i] = row
        return out_rows

    def end_stream(self) -> dict[str, float]:
        """Finish a streamed step: normalise the accumulated gradients, clip, one optimiser step. Nothing to
        learn from (no sample forwarded) means no step (and no loss metrics: a zero gradient norm)."""
        if self._stream_live == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return {"grad_norm": 0.0, "samples_forwarded": 0.0, **self._routing_metrics()}
        if self._stream_total is None:  # the batch's weight is known only now
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(self._stream_weight)
        self._reduce_gradients()
        grad_norm = self._clip_gradients()
        self._step_and_free_gradients()
        metrics = {k: v / self._stream_live for k, v in self._sum_over_data(self._stream_totals).items()}
        metrics["grad_norm"] = float(grad_norm)
        metrics["samples_forwarded"] = float(self._stream_forwarded)
        return {**metrics, **self._routing_metrics()}

    @staticmethod
    def _raw_weights(items: Sequence[Any], aggregation: str) -> list[float]:
        """Unnormalised loss shares (see :meth:`_shares`): tokens for ``token_mean``, valid sequences otherwise."""
        if aggregation == "token_mean":
            return [float(sum(it.loss_mask[1:])) for it in items]
        return [1.0 if sum(it.loss_mask[1:]) > 0 else 0.0 for it in items]

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a policy state dict into the model (the reference role loads the warmed-up policy this way)."""
        self.model.load_state_dict(state)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    # -- what every actor backend offers besides training (see actors/megatron/actor.py for the megatron one) ----------

    @property
    def hf_template(self) -> torch.nn.Module:
        """An HF model with the policy's structure: its names (DCS pushes) and config."""
        return self.model

    def hf_model(self) -> torch.nn.Module:
        """A frozen HF copy of the current policy (a reference model, an export)."""
        return copy.deepcopy(self.model).eval()

    def save_checkpoint(self, directory: str | Path) -> Path:
        """The policy, ``save_pretrained`` style (weights, config, processor)."""
        return save_policy(self.model, self.processor, directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Load the weights :meth:`save_checkpoint` wrote into this actor's model, in place (the optimizer keeps
        pointing at the same parameters; :mod:`~relax_gym.trainer.run.checkpoint` restores its state)."""
        dtype = next(self.model.parameters()).dtype
        loaded = type(self.model).from_pretrained(str(directory), dtype=dtype)
        self.model.load_state_dict(loaded.state_dict())

    def close(self) -> None:
        """Nothing to release (the megatron backend tears down its process group here)."""


def masked_logprobs(logits: torch.Tensor, targets: torch.Tensor, where: torch.Tensor, blocked: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """Log-probs (B, T-1) of ``targets`` from ``logits`` of the ``where`` positions only (0 elsewhere), with the
    ``blocked`` token ids -- those the sampler never emits -- masked to -inf first."""
    if len(blocked):
        logits = logits.index_fill(-1, blocked.to(logits.device), float("-inf"))
    picked = token_logprobs(logits, targets[where], temperature=temperature)
    return torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device).masked_scatter(where, picked)


def collate_on(model: torch.nn.Module, processor: Any, items: Sequence[Any]) -> dict[str, Any]:
    """``items`` (objects with input_ids, loss_mask, mm) as one right-padded model batch on ``model``'s device: the
    input of every forward the trainer runs on trajectories (the actor's, the critic's)."""
    batch = processor.collate(list(items), padding_side="right")
    device = next(model.parameters()).device
    if device.type != "cpu":
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


def _per_token(advantages: Advantages) -> bool:
    return not (isinstance(advantages, torch.Tensor) and advantages.dim() == 1)


def _has_signal(advantages: Advantages, i: int) -> bool:
    """Item ``i`` has a non-zero advantage (on some token, for per-token rows)."""
    if _per_token(advantages):
        return bool(torch.as_tensor(advantages[i]).ne(0).any())
    return float(advantages[i]) != 0.0


def _take(advantages: Advantages, idx: Sequence[int]) -> Advantages:
    if _per_token(advantages):
        return [advantages[i] for i in idx]
    return advantages[list(idx)]


def _advantage_matrix(advantages: Advantages, rows: Sequence[int], shape: torch.Size) -> torch.Tensor:
    """The ``rows`` of ``advantages`` as ``policy_loss`` takes them: ``[B]`` per item, or per-token rows
    right-padded with zeros to ``shape`` (B, T-1)."""
    if _per_token(advantages):
        return _stack([torch.as_tensor(advantages[i], dtype=torch.float32) for i in rows], shape)
    return advantages[list(rows)]


def _chunks(xs: list, n: int) -> list[list]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]


def _stack(rows: Sequence[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """Right-pad 1-D rows with zeros to ``shape`` (B, T)."""
    out = torch.zeros(shape)
    for i, row in enumerate(rows):
        n = min(len(row), shape[1])
        out[i, :n] = row[:n]
    return out


def _mismatch(train_lps: torch.Tensor, rollout_lps: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |train - rollout| log-prob over sampled tokens: how far the engine's numbers are from the trainer's."""
    n = float(mask.sum())
    if n == 0:
        return 0.0
    gap = torch.where(mask.bool(), (train_lps - rollout_lps).abs(), torch.zeros_like(train_lps))  # -inf at padding
    return float(gap.sum() / n)
