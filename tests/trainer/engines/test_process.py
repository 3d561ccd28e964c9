"""An engine server in a child process: a start-up failure comes back as one error with the child's reason."""

from __future__ import annotations

import pytest

from relax_gym.trainer.engines.process import spawn_engine


def test_a_child_that_cannot_start_reports_why():
    with pytest.raises(RuntimeError, match="failed to start: ValueError: max_batch must be >= 1, got 0"):
        spawn_engine(max_batch=0)
