"""Start a local Ray instance that survives a busy machine.

``ray.init()`` gives its new node 30 seconds (a constant inside Ray) to register with the GCS and raises "The
current node timed out during startup" after that. On a loaded machine (a 2-core laptop running a test suite, two
busy processes beside it) the raylet can miss that window although nothing is wrong. :func:`start_local_ray` then
stops the processes that attempt started (this process's descendants that were not there before it: the GCS
server, the raylet, its agents) and tries again, a few times, before it gives up with Ray's own error.

Ray starts its worker processes at niceness 15 (``worker_niceness``), to keep its own daemons responsive. In a run
of ours every role replica is such a worker, so on a busy machine (a laptop compiling beside the run, a test suite
beside two busy loops) the whole run would get a few per cent of the CPU: with two busy processes on 2 cores the
suite's Ray Serve trainings stalled (each replica at ~3 %). The instances started here keep their workers at the
niceness of the process that starts them.
"""

from __future__ import annotations

from typing import Any

STARTUP_TIMEOUT = "timed out during startup"  # the words of Ray's error for a node that did not register in time
WORKER_NICENESS = 0  # Ray's default is 15 (see above)


def start_local_ray(*, attempts: int = 3, **init_kwargs: Any) -> Any:
    """``ray.init(**init_kwargs)`` for a new local instance (its workers not niced, unless ``_system_config`` says
    otherwise), tried up to ``attempts`` times when the node misses Ray's start-up window; each failed attempt's
    processes are stopped first. Other errors are raised at once."""
    import ray

    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    init_kwargs["_system_config"] = {"worker_niceness": WORKER_NICENESS, **(init_kwargs.get("_system_config") or {})}
    for attempt in range(1, attempts + 1):
        before = descendants()
        try:
            return ray.init(**init_kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this one
            if STARTUP_TIMEOUT not in str(exc) or attempt == attempts:
                raise
            stop_descendants_except(before)
            ray.shutdown()
    raise AssertionError("unreachable")


def descendants() -> set[tuple[int, float]]:
    """This process's descendants as ``(pid, start time)`` (a pid alone may be reused)."""
    import psutil

    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            found.add((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            continue
    return found


def stop_descendants_except(before: set[tuple[int, float]]) -> list[int]:
    """Kill this process's descendants that are not in ``before`` (what a failed start left: its GCS, raylet and
    agents) and wait for them; their pids."""
    import psutil

    born = []
    for child in psutil.Process().children(recursive=True):
        try:
            if (child.pid, child.create_time()) not in before:
                born.append(child)
        except psutil.NoSuchProcess:
            continue
    for child in born:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(born, timeout=30)
    return [c.pid for c in born]
