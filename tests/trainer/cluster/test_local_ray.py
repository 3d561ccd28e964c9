"""relax_gym/trainer/cluster/local_ray.py: a local Ray start that misses Ray's start-up window is stopped and tried
again; other errors are not retried; its workers run at our niceness, not Ray's 15. Ray's init is replaced by one that starts a real child process (as a failed
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
        want = {"num_cpus": 8, "namespace": "t", "_system_config": {"worker_niceness": 0}}
        assert fake.calls == [want] * 3 and fake.shutdowns == 2
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


def test_workers_run_at_the_niceness_of_the_process_that_started_ray(ray_session):
    """The session's Ray (started by start_local_ray): an actor's process is not niced below this one. At Ray's
    default (15) two busy processes on 2 cores left every role replica a few per cent of the CPU."""
    import os

    @ray_session.remote(num_cpus=0)
    class Probe:
        def niceness(self) -> int:
            return os.nice(0)

    probe = Probe.remote()
    try:
        assert ray_session.get(probe.niceness.remote(), timeout=300) == os.nice(0)
    finally:
        ray_session.kill(probe)


def test_a_given_system_config_is_kept_and_may_set_the_niceness(flaky):
    fake = flaky(failures=0)
    local_ray.start_local_ray(_system_config={"worker_niceness": 5, "object_timeout_milliseconds": 7})
    assert fake.calls == [{"_system_config": {"worker_niceness": 5, "object_timeout_milliseconds": 7}}]
