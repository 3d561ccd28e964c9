"""Suite-wide fixtures and the CI strictness switch.

With RELAX_GYM_CI=1 (set by .ci/run) a skipped test is reported as a failure: a test that needs a real part
(Docker, Ray) must run in CI, not silently skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# OpenMP (torch's intra-op thread pool) keeps an idle thread spinning for a while after each parallel region. Two
# xdist workers, their child processes and the Ray replicas share 2 cores, so that spin takes CPU from the tests that
# have work: with the threads sleeping instead, a CPU-heavy slice of the suite (tests/trainer/test_actor_hf.py,
# test_ppo_train.py, test_resume.py, test_megatron_actor.py, dcs/, ...) ran in 44 s instead of 53 s, using 81 instead
# of 98 busy core-seconds (docs/benchmarks.md). The thread counts, and so every result, stay as they were. Set here,
# before anything loads torch; the workers and every process they start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The cache (bundled samples, bases, judges) follows the library's one rule, as `make train` does:
# $RELAX_GYM_CACHE, else ~/.cache/relax-gym. The suite does not choose its own; .ci/run sets RELAX_GYM_CACHE.


# pytest-timeout's limits (the `timeout` markers, and the ini default of pyproject.toml) guard against hangs; they are
# not speed bounds. A busy 2-core machine (two busy loops beside the suite: scripts/test_under_load.sh) runs a test
# several times slower than a quiet one, so every marker's limit is stretched by this factor here, in one place.
TIMEOUT_STRETCH = 3


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("timeout")
        if marker is not None and marker.args and isinstance(marker.args[0], (int, float)):
            item.add_marker(pytest.mark.timeout(marker.args[0] * TIMEOUT_STRETCH, *marker.args[1:], **marker.kwargs),
                            append=False)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent when pytest runs without xdist
def pytest_xdist_make_scheduler(config, log):
    """Tests that share a machine-wide resource run one after another on one worker (tests/xdist_groups.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import make_scheduler

    return make_scheduler(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("RELAX_GYM_CI") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under RELAX_GYM_CI=1, which forbids skips: {reason}"
    if report.when == "call" and report.duration > LONG_TEST_S and not slow_reason(item):
        report.user_properties.append(("long_without_reason", round(report.duration, 1)))


LONG_TEST_S = 60.0  # a test that runs longer carries @pytest.mark.slow(reason=...) saying why it needs that long


def slow_reason(item) -> str | None:
    marker = item.get_closest_marker("slow")
    return marker.kwargs.get("reason") if marker is not None else None


def pytest_terminal_summary(terminalreporter):
    """Name the tests that ran over LONG_TEST_S without a slow(reason=...) marker (a note, not a failure: how
    long a test takes depends on the machine's load, and no test may fail on that)."""
    unmarked = [(dict(r.user_properties)["long_without_reason"], r.nodeid)
                for reports in terminalreporter.stats.values() for r in reports
                if getattr(r, "user_properties", None) and "long_without_reason" in dict(r.user_properties)]
    if unmarked:
        terminalreporter.section(f"over {LONG_TEST_S:.0f} s without @pytest.mark.slow(reason=...)")
        for seconds, nodeid in sorted(unmarked, reverse=True):
            terminalreporter.write_line(f"{seconds:7.1f}s {nodeid}")


@pytest.fixture
def clean_registry(monkeypatch):
    """Restore the registry after a test that adds envs or changes the search path (undoing its monkeypatches
    first, so discovery runs on the original search path)."""
    from .registry_state import restored_registry

    with restored_registry():
        yield
        monkeypatch.undo()


@pytest.fixture(scope="session")
def nextqa_head_csv() -> Path:
    """Eight real NExT-QA val rows, shipped with the tests (tests/data/nextqa: source and license)."""
    return REPO / "tests" / "data" / "nextqa" / "val_head.csv"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the tests that use it (start-up costs 5-15 s and ~1.2 GB), started by the first
    of them and stopped when the worker moves on to tests that need none (:func:`pytest_runtest_teardown`; started
    again by the next that does, :func:`pytest_runtest_setup`).

    Logical CPUs are declared generously so TransferQueue's actors and Serve deployments (which mostly wait)
    fit next to each other on a 2-core machine; auth is off for local tests only."""
    ray = pytest.importorskip("ray")
    _start_test_ray()
    yield ray
    _stop_test_ray()


_RAY_USED = False  # set once a test of this process used ray_session


def _start_test_ray() -> None:
    global _RAY_USED
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TQ_NUM_THREADS", "2")
    import ray

    _RAY_USED = True
    if not ray.is_initialized():
        from relax_gym.trainer.cluster.local_ray import start_local_ray

        start_local_ray(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False,
                        namespace="relax-gym-tests")


def _stop_test_ray() -> None:
    import ray

    if not ray.is_initialized():
        return
    try:
        from ray import serve

        serve.shutdown()
    except Exception:  # noqa: BLE001 - Serve may never have started
        pass
    ray.shutdown()


def _needs_ray(item) -> bool:
    """The test uses the session's Ray instance: it asks for ``ray_session``, or its file does (some fixtures ask for
    it only when a parameter needs it, through ``request.getfixturevalue``)."""
    return "ray_session" in item.fixturenames or "ray_session" in _source(item.path)


def _ray_stays_for(item, nextitem) -> bool:
    """Whether the Ray instance stays up after ``item``: the next test may use it, or it is in the "ray" group (its
    files run back to back on this worker: a restart between them would cost more than the instance idling)."""
    if nextitem is None:
        return False
    if _needs_ray(nextitem):
        return True
    from tests.xdist_groups import serial_group

    # the file as the suite names it (relative to the root: where the repository is cloned must not matter)
    return serial_group(Path(nextitem.nodeid.split("::")[0]), _source(nextitem.path)) == "ray"


_SOURCES: dict[Path, str] = {}


def _source(path: Path) -> str:
    if path not in _SOURCES:
        _SOURCES[path] = path.read_text(encoding="utf-8") if path.suffix == ".py" else ""
    return _SOURCES[path]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _RAY_USED and _needs_ray(item):
        _start_test_ray()  # stopped after an earlier test; the session fixture's value (the ray module) stays valid


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """An idle local Ray instance with Serve costs ~6.6 s of CPU a minute (its controller, GCS, raylet, agents:
    measured alone, docs/benchmarks.md), so it is stopped once the tests that use it are done, after the module
    fixtures that may hold its actors are torn down."""
    yield
    if _RAY_USED and not _ray_stays_for(item, nextitem):
        _stop_test_ray()


@pytest.fixture(scope="session")
def standin_3b(tmp_path_factory) -> Path:
    """A Qwen2.5-Omni-3B stand-in (published layout, real widths, one layer per stack, bf16), written once per
    session (~25 s, 2 GB on disk) and shared: tests that load it must not write into it."""
    from relax_gym.trainer.models.standin import write_standin

    return write_standin("qwen2.5-omni-3b", tmp_path_factory.mktemp("standin") / "qwen2.5-omni-3b", layers=1)
