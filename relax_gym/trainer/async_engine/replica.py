"""Small things every role replica does when it starts, kept out of the role modules (which never import one
another): torch thread count, a stable replica name, announcing the replica to the run's registry (the controller
counts restarts there), the policy's processor without building the model."""

from __future__ import annotations

import os
import uuid
from typing import Any

__all__ = ["announce_replica", "build_processor_only", "replica_name", "retries_within", "setup_replica"]


def setup_replica(torch_threads: int | None) -> None:
    """Pin torch's intra-op threads (a 2-core node runs several compute roles side by side)."""
    if torch_threads is not None:
        import torch

        torch.set_num_threads(int(torch_threads))
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))


def replica_name() -> str:
    """The Serve replica id inside a deployment, else a fresh id (a role object used without Serve)."""
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        return str(getattr(ctx, "replica_tag", None) or ctx.replica_id)
    except Exception:  # noqa: BLE001 - not inside a Serve replica
        return f"local-{uuid.uuid4().hex[:8]}"


def announce_replica(registry: Any, role: str) -> int:
    """Tell the run's :class:`~relax_gym.trainer.async_engine.recovery.ReplicaRegistry` (a Ray actor handle; None outside an
    async run) that a replica of ``role`` has started: a start beyond the role's replica count is a restart.
    Returns how many replicas of the role have started in this topology, this one included (1 without one)."""
    if registry is None:
        return 1
    import ray

    return int(ray.get(registry.started.remote(role, replica_name())))


def retries_within(wait_s: float, first_s: float = 0.2, cap_s: float = 5.0) -> int:
    """How many retries an engine client (backoff ``first_s`` doubling up to ``cap_s``) needs to keep trying for
    ``wait_s`` seconds: how long a caller waits for a replaced replica."""
    n, total = 0, 0.0
    while total < wait_s:
        total += min(first_s * 2**n, cap_s)
        n += 1
    return n


def build_processor_only(model_cfg: Any) -> Any:
    """The policy's processor (tokenizer, media encoders) without the model's weights."""
    from relax_gym.trainer.policy.processor import OmniProcessor, build_processor

    if model_cfg.path is not None:
        return OmniProcessor.from_pretrained(model_cfg.path)
    return build_processor(model_cfg)
