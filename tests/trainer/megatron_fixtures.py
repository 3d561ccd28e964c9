"""Fixtures of the megatron backend tests (imported by each ``test_megatron_*`` module): the default tiny thinker
in HF and, built from the same seed, its megatron actor (megatron-core's GPTModel as the language decoder)."""

from __future__ import annotations

import pytest

from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.actors.megatron.actor import MegatronActor


@pytest.fixture(scope="module")
def megatron_policy():
    """``(HF thinker, MegatronActor)`` on the same seed-0 weights; the actor is closed afterwards."""
    hf_model, processor = build_policy()
    mc_model, _ = build_policy()
    actor = MegatronActor(mc_model, processor, lr=1e-3, micro_batch_size=8)
    yield hf_model, actor
    actor.close()
