"""A foreign env in async mode: GEM's Guess The Number (recipes/cpu-gem-guess.yaml, made small) trains three async steps on real Ray Serve. Each env-worker
replica (a Ray process) makes ``gem:...`` itself, so it finds the GEM venv in the cache (built once, under a lock,
by whichever process asked first) and starts its own env server there; the trainer's processes never import gem."""

from __future__ import annotations

import pytest

from ..envs.interop.training import GEM_RECIPE, train_three_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="three async steps on Ray Serve against GEM's venv"),
              pytest.mark.timeout(600)]


def test_three_async_steps_on_guess_the_number(ray_session, tmp_path):
    steps = train_three_steps(tmp_path, GEM_RECIPE, "trainer.mode=async",
                              "roles.bus=inprocess", "trainer.max_staleness=1")
    assert all(r["episodes_trained"] == 4 for r in steps), steps
