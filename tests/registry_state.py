"""Put the env registry (ours and gymnasium's) back as it was after a test that registers envs or changes the search
path, so a test env never shows up in a later test's ``envs list`` / ``envs check --all``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium

from relax_gym.envs import discover
from relax_gym.envs import registry as reg


@contextmanager
def restored_registry() -> Iterator[None]:
    saved_specs, saved_gym = dict(reg._specs), dict(gymnasium.registry)
    saved_versions = {k: dict(v) for k, v in reg._versions.items()}
    try:
        yield
    finally:
        reg._specs.clear()
        reg._specs.update(saved_specs)
        reg._versions.clear()
        reg._versions.update(saved_versions)
        gymnasium.registry.clear()
        gymnasium.registry.update(saved_gym)
        discover(force=True)
