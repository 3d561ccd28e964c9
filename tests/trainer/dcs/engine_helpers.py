"""What the DCS tests that push to an embedded engine in this process share: the engine behind its HTTP server,
a second policy as the actor (the fixtures ``engine`` and ``actor`` in conftest.py), weights shifted to tell pushes
apart, and the check that an engine holds them."""

from __future__ import annotations

import torch

from relax_gym.trainer.dcs.group import GroupReceiver, tensor_digest
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.http_server import serve
from relax_gym.trainer.policy.model import PolicyConfig, build_policy


def in_process_engine(receiver: GroupReceiver) -> tuple[EmbeddedEngine, object]:
    """An embedded engine (policy seed 0) receiving weights through ``receiver``, and its HTTP server."""
    model, processor = build_policy(PolicyConfig(seed=0))
    eng = EmbeddedEngine(model, processor, max_batch=4, weight_receiver=receiver, dist_timeout_s=10)
    return eng, serve(eng, close_engine=True)


def actor_policy():
    """The actor's model: the policy with another seed, so every pushed tensor differs from the engine's."""
    return build_policy(PolicyConfig(seed=1))[0]


def shifted(model, k: float) -> dict[str, torch.Tensor]:
    return {name: t + k for name, t in model.state_dict().items()}


def assert_holds(eng: EmbeddedEngine, state: dict[str, torch.Tensor], names: dict[str, str]) -> None:
    local = {names[k]: tensor_digest(v) for k, v in state.items()}
    assert eng.weights_checksum(list(local)) == local
