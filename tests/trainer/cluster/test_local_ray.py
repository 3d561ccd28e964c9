"""relax_gym/trainer/cluster/local_ray.py: a local Ray start that misses Ray's start-up window is stopped and tried
again; other errors are not retried. Ray's init is replaced by one that starts a real child process (as a failed
attempt leaves its GCS and raylet behind) and fails the way Ray does."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
import ray

from relax_gym.trainer.cluster import local_ray

RAY_ERROR = ("The current node timed out during startup. This could happen because some of the raylet failed to "
             "startup or the GCS has become overloaded.")


class FlakyInit:
    def __init__(self, failures: int, error: str = RAY_ERROR) -> None:
        self.failures, self.error = failures, error
        self.calls: list[dict] = []
        self.left_behind: list[subprocess.Popen] = []
        self.shutdowns = 0

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if len(self.calls) <= self.failures:
            self.left_behind.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
            raise Exception(self.error)  # noqa: TRY002 - what Ray raises
        return "context"

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def flaky(monkeypatch):
    def make(failures: int, error: str = RAY_ERROR) -> FlakyInit:
        fake = FlakyInit(failures, error)
        monkeypatch.setattr(ray, "init", fake.init)
        monkeypatch.setattr(ray, "shutdown", fake.shutdown)
        return fake

    yield make


def test_a_missed_start_up_window_is_stopped_and_tried_again(flaky):
    fake = flaky(failures=2)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # born before the start
    try:
        assert local_ray.start_local_ray(attempts=3, num_cpus=8, namespace="t") == "context"
        assert fake.calls == [{"num_cpus": 8, "namespace": "t"}] * 3 and fake.shutdowns == 2
        for child in fake.left_behind:  # each failed attempt's processes were killed and reaped
            assert child.poll() is not None
        assert bystander.poll() is None and psutil.pid_exists(bystander.pid)  # an older child is left alone
    finally:
        bystander.kill()
        bystander.wait()


def test_the_last_failure_and_any_other_error_are_raised(flaky):
    fake = flaky(failures=5)
    with pytest.raises(Exception, match="timed out during startup"):
        local_ray.start_local_ray(attempts=2)
    assert len(fake.calls) == 2
    other = flaky(failures=1, error="ray was given a bad address")
    with pytest.raises(Exception, match="bad address"):
        local_ray.start_local_ray(attempts=3)
    assert len(other.calls) == 1  # not retried
    for child in fake.left_behind + other.left_behind:
        child.kill()
        child.wait()
    with pytest.raises(ValueError, match="attempts"):
        local_ray.start_local_ray(attempts=0)
