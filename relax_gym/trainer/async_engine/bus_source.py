"""What a role is given as its data bus: a :class:`~relax_gym.trainer.databus.link.BusLink` (a deployed run: the
role connects inside its replica) or a bus object itself (in-process use, tests); and the in-process bus that
stands in for a deployed one (the planner's drive of the controller)."""

from __future__ import annotations

from typing import Any

from relax_gym.trainer.databus import make_bus
from relax_gym.trainer.databus.link import BusLink

__all__ = ["in_process_bus", "open_bus"]


def open_bus(source: BusLink | Any) -> Any:
    """The bus a role talks to: ``source.connect()`` for a BusLink, else ``source`` (already a bus)."""
    return source.connect() if isinstance(source, BusLink) else source


def in_process_bus(**kwargs: Any) -> Any:
    """A bus in this process (:class:`~relax_gym.trainer.databus.twin.InProcessBus`: ``lease_timeout``, ``group_field``,
    ``clock``)."""
    return make_bus("inprocess", **kwargs)
