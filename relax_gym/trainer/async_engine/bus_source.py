"""What a role is given as its data bus: a :class:`~relax_gym.trainer.databus.link.BusLink` (a deployed run: the
role connects inside its replica) or a bus object itself (in-process use, tests)."""

from __future__ import annotations

from typing import Any

from relax_gym.trainer.databus.link import BusLink

__all__ = ["open_bus"]


def open_bus(source: BusLink | Any) -> Any:
    """The bus a role talks to: ``source.connect()`` for a BusLink, else ``source`` (already a bus)."""
    return source.connect() if isinstance(source, BusLink) else source
