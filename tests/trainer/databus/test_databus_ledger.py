"""The delivery ledger on its own, with a hand-driven clock: the rules both buses inherit."""

from __future__ import annotations

import pytest
import torch

from relax_gym.trainer.databus.checks import column_dtypes, group_key
from relax_gym.trainer.databus.ledger import BATCH, EXHAUSTED, WAIT, DeliveryLedger
from relax_gym.trainer.databus.protocol import DataBusInputError, LeaseError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ledger_with(n: int, *, lease_timeout: float | None = 10.0, **open_kw):
    clock = Clock()
    ledger = DeliveryLedger(lease_timeout, clock=clock)
    ledger.open(0, **open_kw)
    ledger.register(0, [f"s{i}" for i in range(n)])
    return ledger, clock


def test_pick_orders_by_put_and_waits_or_exhausts():
    ledger, _ = ledger_with(5)
    assert ledger.pick(1, "t", 2).verdict == WAIT  # nobody opened partition 1
    assert ledger.pick(0, "t", 2, ready_ids=["s3"]).verdict == WAIT
    got = ledger.pick(0, "t", 2, ready_ids=["s4", "s1", "s3"])
    assert got.verdict == BATCH and got.lease.sample_ids == ["s1", "s3"]
    ledger.seal(0, 5)
    tail = ledger.pick(0, "t", 4, ready_ids=[f"s{i}" for i in range(5)])
    assert tail.lease.sample_ids == ["s0", "s2", "s4"]
    assert ledger.pick(0, "t", 4, ready_ids=[f"s{i}" for i in range(5)]).verdict == EXHAUSTED  # all leased
    ledger.give_back(tail.lease.lease_id, 0, "t")
    assert ledger.pick(0, "t", 4, ready_ids=[f"s{i}" for i in range(5)]).lease.sample_ids == ["s0", "s2", "s4"]


def test_ready_indexes_map_through_bound_rows():
    ledger, _ = ledger_with(3)
    ledger.bind(0, ["s0", "s1", "s2"], [40, 41, 7])
    got = ledger.pick(0, "t", 2, ready_indexes=[7, 41, 99])  # 99: an index the ledger never saw
    assert got.lease.sample_ids == ["s1", "s2"]


def test_leases_run_out_on_the_clock():
    ledger, clock = ledger_with(2, lease_timeout=5.0)
    first = ledger.pick(0, "t", 2, ready_ids=["s0", "s1"]).lease
    assert ledger.next_deadline() == 5.0
    clock.now = 5.0
    assert ledger.expire() == 2 and ledger.next_deadline() is None
    second = ledger.pick(0, "t", 2, ready_ids=["s0", "s1"]).lease
    with pytest.raises(LeaseError, match="handed out again"):
        ledger.ack(first.lease_id, 0, "t")
    assert ledger.give_back(first.lease_id, 0, "t") == 0  # its rows are already back: a no-op
    with pytest.raises(LeaseError, match="given back after it ran out"):
        ledger.ack(first.lease_id, 0, "t")
    assert ledger.ack(second.lease_id, 0, "t") == 2


def test_leases_belong_to_one_task_and_partition():
    ledger, _ = ledger_with(2)
    lease = ledger.pick(0, "actor", 2, ready_ids=["s0", "s1"]).lease
    with pytest.raises(LeaseError, match="belongs to task 'actor' on partition 0, not task 'reference'"):
        ledger.ack(lease.lease_id, 0, "reference")
    with pytest.raises(LeaseError, match="unknown lease"):
        ledger.ack("nope", 0, "actor")
    assert ledger.ack(lease.lease_id, 0, "actor") == 2  # the refused calls changed nothing
    assert ledger.acked_ids(0, "actor") == {"s0", "s1"}


def test_declarations_and_seals_are_checked():
    ledger, _ = ledger_with(2, expected_rows=3)
    with pytest.raises(DataBusInputError, match="partition 0 expects 3 rows; 2 more would make 4"):
        ledger.register(0, ["a", "b"])
    with pytest.raises(DataBusInputError, match="partition 0: seal at 4 rows exceeds expected_rows 3"):
        ledger.seal(0, 4)
    ledger.seal(0, 2)
    with pytest.raises(DataBusInputError, match="already sealed at 2 rows, not 3"):
        ledger.seal(0, 3)
    with pytest.raises(DataBusInputError, match="expected_rows must be a positive int"):
        ledger.open(1, expected_rows=0)
    with pytest.raises(DataBusInputError, match="group_size=2 declared but row 's0' was put without a group"):
        ledger.open(0, group_size=2)
    with pytest.raises(DataBusInputError, match="lease_timeout must be None or > 0"):
        DeliveryLedger(0)
    assert ledger.progress(0, "t") == {"rows": 2, "sealed": 2, "expected_rows": 3, "group_size": None,
                                       "dropped": False, "acked": 0, "leased": 0, "media": 0,
                                       "media_bytes": 0}
    assert ledger.progress(9)["rows"] == 0


def test_unregister_lets_a_failed_put_be_retried():
    ledger = DeliveryLedger()
    ledger.open(0, group_size=2)
    ledger.register(0, ["a", "b"], groups=[1, 1], dtypes={"x": "torch.float32"})
    ledger.unregister(0, ["a", "b"])
    ledger.register(0, ["a", "b"], groups=[1, 1])
    assert ledger.progress(0)["rows"] == 2


def test_group_values_and_dtypes():
    assert group_key(0, "s", torch.tensor(7)) == 7
    with pytest.raises(DataBusInputError, match="row 's' has an unhashable group value"):
        group_key(0, "s", [1, 2])
    assert column_dtypes(0, {"x": [torch.ones(1), 3], "y": ["a"]}) == {"x": "torch.float32"}
