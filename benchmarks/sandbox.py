"""Sandbox figures, each measured within one run (ratios are what to compare; absolute times vary by machine):

- warm acquire: p50 / p99 of ``SandboxPool.acquire`` when a warm sandbox is idle (per backend);
- per-episode sandbox overhead: what one tool-use episode asks of its sandbox from a warm pool (acquire, write
  ``main.py``, run ``python3 main.py``, release = reset), p50 in ms, with each phase's p50;
- bwrap exec overhead: ``python3 -c pass`` through the bwrap backend vs a bare subprocess, interleaved (ratio);
- docker exec overhead: ``python3 -c pass`` through our docker backend (commands over the channel to PID 1), through
  our ``docker exec`` path (``RELAX_GYM_DOCKER_EXEC=api``, the path before the channel) and through a raw docker
  SDK ``exec_run`` on the same container, interleaved (ratios to the raw SDK);
- docker lifecycle: p50 of creating a sandbox (create + attach + start + first answer) and of closing one;
- throughput: 32 concurrent tool-use episodes (gold policy: one python call + answer), episodes/s per backend (and
  for docker through ``docker exec``, ``docker-api``): a first wave on a cold pool (one sandbox warm, the rest made
  on demand), then a second wave on the sandboxes the first left warm.

Run: `python benchmarks/sandbox.py [--repeats 30]`. Backends that cannot run here are reported, not measured;
``run(quick)`` returns the figures as a dict (quick: 10 repeats, 8 episodes), or ``{"skipped": reason}`` when
no backend works here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.envs.episode_sandbox import shared_pool
from relax_gym.sandbox import SandboxPool, SandboxSpec, doctor, get_backend, sync
from relax_gym.sandbox.docker import EXEC_MODE_VAR

SPEC = SandboxSpec(memory_mb=256, pids=64)
TOOL_CODE = "print(sum(i * i for i in range(1, 1001) if i % 7 == 0))\n"  # a tool-use-sized program


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def warm_acquire_ms(name: str, repeats: int) -> tuple[float, float]:
    async with SandboxPool(get_backend(name), min_warm=1, max_size=1, default_spec=SPEC) as pool:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            lease = await pool.acquire(SPEC)
            times.append((time.perf_counter() - t0) * 1e3)
            await pool.release(lease)
    return statistics.median(times), pct(times, 0.99)


@contextlib.contextmanager
def docker_exec_mode(mode: str | None):
    """Docker sandboxes created inside use ``mode`` ("channel" or "api"; None: the default)."""
    before = os.environ.get(EXEC_MODE_VAR)
    if mode is not None:
        os.environ[EXEC_MODE_VAR] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(EXEC_MODE_VAR, None)
        else:
            os.environ[EXEC_MODE_VAR] = before


async def episode_overhead_ms(name: str, repeats: int) -> dict[str, float]:
    """p50 ms of one episode's sandbox work from a warm pool, in total and per phase."""
    phases: dict[str, list[float]] = {"acquire": [], "write": [], "exec": [], "release": [], "total": []}
    async with SandboxPool(get_backend(name), min_warm=1, max_size=1, default_spec=SPEC) as pool:
        for i in range(repeats + 1):
            marks = [time.perf_counter()]
            lease = await pool.acquire(SPEC)
            marks.append(time.perf_counter())
            await lease.write_file("main.py", TOOL_CODE)
            marks.append(time.perf_counter())
            result = await lease.exec("python3 main.py", timeout=10)
            marks.append(time.perf_counter())
            await pool.release(lease)
            marks.append(time.perf_counter())
            assert result.ok and result.stdout.strip(), result
            if i == 0:  # warm-up
                continue
            for phase, a, b in zip(("acquire", "write", "exec", "release"), marks, marks[1:]):
                phases[phase].append((b - a) * 1e3)
            phases["total"].append((marks[-1] - marks[0]) * 1e3)
    return {phase: statistics.median(values) for phase, values in phases.items()}


async def docker_lifecycle_ms(repeats: int) -> dict[str, float]:
    backend = get_backend("docker")
    create, close = [], []
    for _ in range(max(3, repeats // 3)):
        t0 = time.perf_counter()
        box = await backend.create(SPEC)
        t1 = time.perf_counter()
        await box.close()
        create.append((t1 - t0) * 1e3)
        close.append((time.perf_counter() - t1) * 1e3)
    return {"create_ms": statistics.median(create), "close_ms": statistics.median(close)}


async def bwrap_vs_bare(repeats: int) -> tuple[float, float]:
    """The same interpreter on both sides: bwrap shows the host's /usr, so /usr/bin/python3 is one binary."""
    box = await get_backend("bwrap").create(SPEC)
    ours, bare = [], []
    argv = ["/usr/bin/python3", "-c", "pass"]
    try:
        await box.exec(argv)
        for _ in range(repeats):
            t0 = time.perf_counter()
            await box.exec(argv)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            await proc.communicate()
            bare.append(time.perf_counter() - t0)
    finally:
        await box.close()
    return statistics.median(ours) * 1e3, statistics.median(bare) * 1e3


async def docker_vs_sdk(repeats: int) -> tuple[float, float, float]:
    """p50 ms of ``python3 -c pass``: our channel, our docker exec path, a raw SDK exec_run (one container each
    for ours, the raw call on the first), interleaved."""
    backend = get_backend("docker")
    box = await backend.create(SPEC)
    with docker_exec_mode("api"):
        api_box = await backend.create(SPEC)
    container = backend._connect().containers.get(box.container_id)
    argv = ["python3", "-c", "pass"]
    ours, api, raw = [], [], []
    try:
        await box.exec(argv)
        await api_box.exec(argv)
        for _ in range(repeats):
            for sink, run_once in ((ours, lambda: box.exec(argv)), (api, lambda: api_box.exec(argv)),
                                   (raw, lambda: asyncio.to_thread(container.exec_run, argv, user=f"{SPEC.uid}:{SPEC.gid}"))):
                t0 = time.perf_counter()
                await run_once()
                sink.append(time.perf_counter() - t0)
    finally:
        await box.close()
        await api_box.close()
    return statistics.median(ours) * 1e3, statistics.median(api) * 1e3, statistics.median(raw) * 1e3


def episodes_per_s(name: str, episodes: int = 32) -> tuple[float, float]:
    """Episodes/s of ``episodes`` concurrent gold tool-use episodes: a first wave on a pool holding one warm
    sandbox (the others are made on demand), then a second wave on the sandboxes the first left warm."""
    def play(seed: int) -> float:
        env = relax_gym.make("tool-use", backend=name)
        try:
            _, info = env.reset(seed=seed)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, info = env.step(info["gold"])
                total += reward
                done = terminated or truncated
            return total
        finally:
            env.close()

    play(10_000)  # warm-up: image, first sandbox
    rates = []
    for wave in range(2):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(episodes) as pool:
            rewards = list(pool.map(play, range(wave * episodes, (wave + 1) * episodes)))
        rates.append(episodes / (time.perf_counter() - t0))
        assert all(r == 1.0 for r in rewards), rewards
    sync.run(shared_pool(name).close())
    return rates[0], rates[1]


def run(quick: bool = False, *, repeats: int | None = None, episodes: int | None = None) -> dict:
    """Measure what the working backends allow. Returns ``{"repeats", "episodes", "backends": {name: {"problem",
    and when it works "acquire_p50_ms", "acquire_p99_ms", "episode_ms", "episode_phases_ms", "episodes_per_s" (a cold pool),
    "warm_episodes_per_s"}},
    "bwrap_exec": {"ours_ms", "bare_ms", "ratio"}, "docker_exec": {"ours_ms", "api_ms", "raw_ms", "ratio",
    "api_ratio"}, "docker_lifecycle": {"create_ms", "close_ms"}}`` (an exec entry only for a working backend; with
    docker, a "docker-api" backend entry: the same figures through ``docker exec``), or ``{"skipped": reason}``
    when neither backend works here."""
    repeats = repeats or (10 if quick else 30)
    episodes = episodes or (8 if quick else 32)
    problems = doctor()
    if all(problems.values()):
        return {"skipped": "no sandbox backend works here: " + "; ".join(f"{k}: {v}" for k, v in problems.items())}
    result: dict = {"repeats": repeats, "episodes": episodes, "backends": {}}
    variants = [(name, name, None) for name in problems]  # (label, backend, docker exec mode)
    if problems["docker"] is None:
        variants.insert(1, ("docker-api", "docker", "api"))
    for label, name, mode in variants:
        entry: dict = {"problem": problems[name]}
        if entry["problem"] is None:
            with docker_exec_mode(mode):
                entry["acquire_p50_ms"], entry["acquire_p99_ms"] = asyncio.run(warm_acquire_ms(name, repeats))
                phases = asyncio.run(episode_overhead_ms(name, repeats))
            entry["episode_ms"] = phases.pop("total")
            entry["episode_phases_ms"] = phases
        result["backends"][label] = entry
    if problems["bwrap"] is None:
        ours, bare = asyncio.run(bwrap_vs_bare(repeats))
        result["bwrap_exec"] = {"ours_ms": ours, "bare_ms": bare, "ratio": ours / bare}
    if problems["docker"] is None:
        ours, api, raw = asyncio.run(docker_vs_sdk(repeats))
        result["docker_exec"] = {"ours_ms": ours, "api_ms": api, "raw_ms": raw, "ratio": ours / raw, "api_ratio": api / raw}
        result["docker_lifecycle"] = asyncio.run(docker_lifecycle_ms(repeats))
    for label, name, mode in variants:
        if problems[name] is None:
            with docker_exec_mode(mode):
                entry = result["backends"][label]
                entry["episodes_per_s"], entry["warm_episodes_per_s"] = episodes_per_s(name, episodes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    result = run(repeats=args.repeats)
    table = Table("figure", "backend", "value", "target", title="sandboxes")
    backends = result.get("backends") or {name: {"problem": problem} for name, problem in doctor().items()}
    for name, entry in backends.items():
        if entry["problem"] is not None:
            table.add_row("(unavailable)", name, entry["problem"] or "", "")
            continue
        table.add_row("warm acquire p50 / p99", name, f"{entry['acquire_p50_ms']:.3f} / {entry['acquire_p99_ms']:.3f} ms", "p50 <= 5 ms")
        phases = " + ".join(f"{k} {v:.1f}" for k, v in entry["episode_phases_ms"].items())
        table.add_row("sandbox work per tool-use episode (p50)", name, f"{entry['episode_ms']:.1f} ms ({phases})", "")
    if "bwrap_exec" in result:
        r = result["bwrap_exec"]
        table.add_row("python3 -c pass: bwrap / bare subprocess", "bwrap", f"{r['ours_ms']:.1f} / {r['bare_ms']:.1f} ms = {r['ratio']:.2f}x", "<= 1.5x")
    if "docker_exec" in result:
        r = result["docker_exec"]
        table.add_row("python3 -c pass: our exec / raw SDK exec_run", "docker", f"{r['ours_ms']:.1f} / {r['raw_ms']:.1f} ms = {r['ratio']:.2f}x", "<= 1.2x")
        table.add_row("python3 -c pass: our docker exec path / raw SDK exec_run", "docker-api", f"{r['api_ms']:.1f} / {r['raw_ms']:.1f} ms = {r['api_ratio']:.2f}x", "")
    if "docker_lifecycle" in result:
        r = result["docker_lifecycle"]
        table.add_row("create / close one sandbox (p50)", "docker", f"{r['create_ms']:.0f} / {r['close_ms']:.0f} ms", "")
    for name in backends:
        if backends[name].get("episodes_per_s") is not None:
            table.add_row(f"{result['episodes']} concurrent tool-use episodes: cold / warm pool", name,
                          f"{backends[name]['episodes_per_s']:.2f} / {backends[name]['warm_episodes_per_s']:.2f} episodes/s", "")
    Console().print(table)


if __name__ == "__main__":
    main()
