"""The async controller's sample ledger across a resume: what counts as lost depends on who counted the steps
before the checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

from relax_gym.trainer.async_engine.ledger import SampleLedger
from relax_gym.trainer.rollout.samples import sample_id
from relax_gym.trainer.run.checkpoint import TrainerState

TRAINER = SimpleNamespace(stragglers="wait", prompts_per_step=2, group_size=2)


def ids(step: int) -> list[str]:
    return [sample_id(step, g, m) for g in range(2) for m in range(2)]


def state(step: int, extra: dict) -> TrainerState:
    return TrainerState(step=step, version=step, cursor={}, rng={}, extra=extra)


def test_a_colocate_checkpoint_resumed_in_async_mode_loses_nothing_before_it():
    ledger = SampleLedger(TRAINER)
    ledger.restore(state(1, {}))  # a colocate run's checkpoint: no ledger in it
    ledger.consumed += ids(2)
    assert ledger.first_step == 2 and ledger.lost(2) == 0
    ledger.consumed.remove(ids(2)[0])  # a sample of a step this run trained that the actor never took
    assert ledger.lost(2) == 1


def test_an_async_checkpoint_keeps_counting_from_the_first_step():
    ledger = SampleLedger(TRAINER)
    ledger.restore(state(1, {"produced": ids(1), "consumed": ids(1)[1:], "given_up": []}))
    ledger.consumed += ids(2)
    assert ledger.first_step == 1 and ledger.lost(2) == 1  # step 1's missing sample still counts
    ledger.restore(None)  # a global restart with no checkpoint: everything over again
    assert ledger.first_step == 1 and ledger.lost(1) == 4
