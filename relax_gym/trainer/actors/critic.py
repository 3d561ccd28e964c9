"""The critic of PPO (``algorithm.name: ppo``): a value model with its own weights, its own optimiser and its own
checkpoint.

    critic = build_critic(cfg, actor.hf_model(), processor)   # at the start of RL, after the warm-up (actors.factory)
    values = critic.values(items)                                         # one row per item, aligned like log-probs
    metrics = critic.train_step(items, returns, values, clip=algo.value_clip)

The value model is the policy's architecture — the same Qwen-Omni thinker, built and loaded the way
:mod:`~relax_gym.trainer.policy` builds the policy, media towers included — initialised from the policy's
weights when RL starts (after the SFT warm-up, so it starts from features that already read the task), with a
scalar head ``Linear(hidden, 1)`` on the last hidden states. The head starts at zero: every value is 0 at first,
so the first advantages are the plain (discounted) rewards, and no random head pushes noise into the backbone.

Why a model of its own, not a value head on the policy's backbone:

- the critic is its own role: in async mode it scales, fails and checkpoints independently of the actor (a critic
  on the policy's backbone would have to live in the actor's process and step with it);
- its regression loss does not reach the policy's features: a shared backbone lets the value error (whose scale
  has nothing to do with the policy loss's) pull on the representation the policy samples from;
- the inference engines keep loading a plain causal LM: the weights pushed to them and saved in checkpoints are
  the policy's alone, with no extra head to strip.

The cost is a second copy of the weights (and of AdamW's state) — for a 7B policy that is what PPO implementations
with a separate critic pay too.

Positions follow the actor's log-probs: row entry ``t`` is the value of the state that predicts token ``t + 1``
(the hidden state at position ``t``), 0 off the loss mask; a row is ``len(input_ids) - 1`` long. Forwards reuse the
actor's batch collation (:func:`~relax_gym.trainer.actors.hf.collate_on`), so images, video and audio reach the
critic's towers exactly as they reach the policy's. MoE routing replay does not apply: the critic's routers are
its own, and the rollout's routing record belongs to the policy.

A checkpoint folder (:meth:`Critic.save`) holds the backbone ``save_pretrained`` style (a policy checkpoint
``model.path`` could load), ``value_head.safetensors`` and ``optimizer.pt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from relax_gym.trainer.actors.hf import collate_on
from relax_gym.trainer.algorithms import explained_variance, value_loss
from relax_gym.trainer.policy.model import save_policy

__all__ = ["HEAD_FILE", "OPTIMIZER_FILE", "Critic", "ValueModel"]

HEAD_FILE = "value_head.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


class ValueModel(nn.Module):
    """A causal LM's body (``backbone.model``, the multimodal thinker) and a scalar head on its last hidden states.
    The backbone keeps its LM head (unused here) so that it saves and loads as a plain policy checkpoint."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.get_text_config().hidden_size
        self.head = nn.Linear(hidden, 1, dtype=torch.float32)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(next(backbone.parameters()).device)

    def forward(self, **batch: Any) -> torch.Tensor:
        """``[B, T]`` values, one per position of the (right-padded) batch, float32."""
        hidden = self.backbone.model(**batch, use_cache=False)[0]
        return self.head(hidden.float()).squeeze(-1)


class Critic:
    """The value model and its optimiser (AdamW; the knobs are the ``critic:`` section's). ``backbone``: a causal LM
    with the policy's architecture -- a copy of the warmed-up policy, e.g. ``actor.hf_model()`` -- that the critic
    owns and trains from now on; the head starts at zero. ``epochs``: optimiser steps per :meth:`train_step`, each
    over its whole batch."""

    def __init__(self, backbone: nn.Module, processor: Any, *, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, grad_clip: float = 1.0, micro_batch_size: int = 32, epochs: int = 1) -> None:
        if micro_batch_size < 1 or epochs < 1:
            raise ValueError(f"micro_batch_size and epochs must be >= 1, got {micro_batch_size} and {epochs}")
        self.processor = processor
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.epochs = epochs
        backbone.requires_grad_(True)
        self.net = ValueModel(backbone)
        self.net.train()
        self.optimizer = torch.optim.AdamW(list(self.net.parameters()), lr=lr, betas=betas, weight_decay=weight_decay)

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    # -- values ---------------------------------------------------------------------------------------------------

    def _forward(self, items: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, mask), both ``[B, T-1]`` on the model's device: the value of each next-token position and the
        loss mask there."""
        batch = collate_on(self.net.backbone, self.processor, items)
        mask = batch.pop("loss_mask")[:, 1:].to(torch.float32)
        values = self.net(**batch)[:, :-1]
        return values, mask

    @torch.no_grad()
    def values(self, items: Sequence[Any]) -> list[torch.Tensor]:
        """One float32 CPU row per item, ``len(input_ids) - 1`` long: the value of each next-token position, 0 off
        the loss mask."""
        items = list(items)
        out: list[torch.Tensor] = []
        for start in range(0, len(items), self.micro_batch_size):
            chunk = items[start : start + self.micro_batch_size]
            values, mask = self._forward(chunk)
            values = (values * mask).cpu()
            out += [row[: len(it.input_ids) - 1].clone() for row, it in zip(values, chunk)]
        return out

    # -- training -------------------------------------------------------------------------------------------------

    def train_step(self, items: Sequence[Any], returns: Sequence[torch.Tensor], old_values: Sequence[torch.Tensor], *,
                   clip: float | None = 0.2) -> dict[str, float]:
        """``epochs`` optimiser steps on the clipped value loss (:func:`~relax_gym.trainer.algorithms.gae.value_loss`)
        over ``items``: ``returns`` are the GAE targets and ``old_values`` what :meth:`values` answered when they
        were computed (rows aligned like :meth:`values`'); the trained tokens are the items' loss masks.

        Micro-batches accumulate gradients weighted by their share of the step's trained tokens, so a step equals
        one token-mean loss over the whole batch. Metrics (``critic_`` for the optimiser's): ``value_loss``,
        ``value_clip_frac``, ``values_mean`` (of the last epoch's forward), ``returns_mean``, ``explained_var``
        (of ``old_values``: how much of the returns' variance the values the advantages used explain),
        ``critic_grad_norm``."""
        items = list(items)
        if not len(items) == len(returns) == len(old_values):
            raise ValueError(f"one returns row and old values row per item: {len(items)} items, {len(returns)} returns, "
                             f"{len(old_values)} old values")
        tokens = [float(sum(it.loss_mask[1:])) for it in items]
        total = sum(tokens)
        live = [i for i, n in enumerate(tokens) if n > 0]
        metrics: dict[str, float] = {"explained_var": _explained_variance(items, returns, old_values)}
        if not live:
            return {**metrics, "value_loss": 0.0, "value_clip_frac": 0.0, "critic_grad_norm": 0.0}
        device = self.device
        for _ in range(self.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            sums = {"value_loss": 0.0, "value_clip_frac": 0.0, "values_mean": 0.0, "returns_mean": 0.0}
            for start in range(0, len(live), self.micro_batch_size):
                idx = live[start : start + self.micro_batch_size]
                values, mask = self._forward([items[i] for i in idx])
                shape = values.shape
                target = _rows(returns, idx, shape).to(device)
                old = _rows(old_values, idx, shape).to(device)
                out = value_loss(values, old, target, mask, clip=clip)
                share = sum(tokens[i] for i in idx) / total
                (out.loss * share).backward()
                for key in sums:
                    sums[key] += out.metrics[key] * share
            grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.grad_clip)
            self.optimizer.step()
        return {**metrics, **sums, "critic_grad_norm": float(grad_norm)}

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # -- state ------------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The value model's weights: ``backbone.*`` (the policy's names under that prefix) and ``head.*``."""
        return {k: v.detach() for k, v in self.net.state_dict().items()}

    def save(self, directory: str | Path) -> Path:
        """Write the backbone (``save_pretrained`` with its processor), the head and the optimizer to ``directory``."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        save_policy(self.net.backbone, self.processor, path)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.net.head.state_dict().items()}, str(path / HEAD_FILE))
        torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
        return path

    def load(self, directory: str | Path) -> None:
        """Load what :meth:`save` wrote into this critic, in place (the optimizer keeps pointing at the same
        parameters)."""
        path = Path(directory)
        missing = [name for name in ("config.json", HEAD_FILE, OPTIMIZER_FILE) if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: not a critic checkpoint (missing {', '.join(missing)})")
        backbone = self.net.backbone
        dtype = next(backbone.parameters()).dtype
        loaded = type(backbone).from_pretrained(str(path), dtype=dtype)
        backbone.load_state_dict(loaded.state_dict())
        self.net.head.load_state_dict({k: v.to(self.device) for k, v in load_file(str(path / HEAD_FILE)).items()})
        self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, map_location=self.device, weights_only=True))


def _rows(rows: Sequence[torch.Tensor], idx: Sequence[int], shape: torch.Size) -> torch.Tensor:
    """Rows ``idx`` of ragged 1-D ``rows``, right-padded with zeros (or cut) to ``shape`` (B, T)."""
    out = torch.zeros(shape, dtype=torch.float32)
    for j, i in enumerate(idx):
        row = torch.as_tensor(rows[i], dtype=torch.float32).reshape(-1)
        n = min(row.numel(), shape[1])
        out[j, :n] = row[:n]
    return out


def _explained_variance(items: Sequence[Any], returns: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> float:
    """Explained variance of ``values`` over every trained token of the batch."""
    picked_v, picked_r = [], []
    for it, ret, val in zip(items, returns, values):
        mask = torch.tensor(it.loss_mask[1:], dtype=torch.bool)
        ret = torch.as_tensor(ret, dtype=torch.float32).reshape(-1)
        val = torch.as_tensor(val, dtype=torch.float32).reshape(-1)
        n = min(len(mask), ret.numel(), val.numel())
        picked_r.append(ret[:n][mask[:n]])
        picked_v.append(val[:n][mask[:n]])
    if not picked_v:
        return 0.0
    v, r = torch.cat(picked_v)[None], torch.cat(picked_r)[None]
    return explained_variance(v, r, torch.ones_like(v))
