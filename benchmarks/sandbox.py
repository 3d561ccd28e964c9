"""Sandbox figures, each measured within one run (ratios are what to compare; absolute times vary by machine):

- warm acquire: p50 / p99 of ``SandboxPool.acquire`` when a warm sandbox is idle (per backend);
- bwrap exec overhead: ``python3 -c pass`` through the bwrap backend vs a bare subprocess, interleaved (ratio);
- docker exec overhead: ``python3 -c pass`` through our docker backend vs a raw docker SDK ``exec_run`` on the same
  container, interleaved (ratio);
- throughput: 32 concurrent tool-use episodes (gold policy: one python call + answer), episodes/s per backend.

Run: `python benchmarks/sandbox.py [--repeats 30]`. Backends that cannot run here are reported, not measured;
``run(quick)`` returns the figures as a dict (quick: 10 repeats, 8 episodes), or ``{"skipped": reason}`` when
no backend works here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.envs.episode_sandbox import shared_pool
from relax_gym.sandbox import SandboxPool, SandboxSpec, doctor, get_backend, sync

SPEC = SandboxSpec(memory_mb=256, pids=64)


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


async def docker_vs_sdk(repeats: int) -> tuple[float, float]:
    backend = get_backend("docker")
    box = await backend.create(SPEC)
    container = backend._connect().containers.get(box.container_id)
    ours, raw = [], []
    try:
        await box.exec(["python3", "-c", "pass"])
        for _ in range(repeats):
            t0 = time.perf_counter()
            await box.exec(["python3", "-c", "pass"])
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await asyncio.to_thread(container.exec_run, ["python3", "-c", "pass"], user=f"{SPEC.uid}:{SPEC.gid}")
            raw.append(time.perf_counter() - t0)
    finally:
        await box.close()
    return statistics.median(ours) * 1e3, statistics.median(raw) * 1e3


def episodes_per_s(name: str, episodes: int = 32) -> float:
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
    t0 = time.perf_counter()
    with ThreadPoolExecutor(episodes) as pool:
        rewards = list(pool.map(play, range(episodes)))
    elapsed = time.perf_counter() - t0
    assert all(r == 1.0 for r in rewards), rewards
    sync.run(shared_pool(name).close())
    return episodes / elapsed


def run(quick: bool = False, *, repeats: int | None = None, episodes: int | None = None) -> dict:
    """Measure what the working backends allow. Returns ``{"repeats", "episodes", "backends": {name: {"problem",
    and when it works "acquire_p50_ms", "acquire_p99_ms", "episodes_per_s"}}, "bwrap_exec": {"ours_ms", "bare_ms",
    "ratio"}, "docker_exec": {"ours_ms", "raw_ms", "ratio"}}`` (an exec entry only for a working backend), or
    ``{"skipped": reason}`` when neither backend works here."""
    repeats = repeats or (10 if quick else 30)
    episodes = episodes or (8 if quick else 32)
    problems = doctor()
    if all(problems.values()):
        return {"skipped": "no sandbox backend works here: " + "; ".join(f"{k}: {v}" for k, v in problems.items())}
    result: dict = {"repeats": repeats, "episodes": episodes, "backends": {}}
    for name, problem in problems.items():
        entry: dict = {"problem": problem}
        if problem is None:
            entry["acquire_p50_ms"], entry["acquire_p99_ms"] = asyncio.run(warm_acquire_ms(name, repeats))
        result["backends"][name] = entry
    if problems["bwrap"] is None:
        ours, bare = asyncio.run(bwrap_vs_bare(repeats))
        result["bwrap_exec"] = {"ours_ms": ours, "bare_ms": bare, "ratio": ours / bare}
    if problems["docker"] is None:
        ours, raw = asyncio.run(docker_vs_sdk(repeats))
        result["docker_exec"] = {"ours_ms": ours, "raw_ms": raw, "ratio": ours / raw}
    for name, entry in result["backends"].items():
        if entry["problem"] is None:
            entry["episodes_per_s"] = episodes_per_s(name, episodes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    result = run(repeats=args.repeats)
    table = Table("figure", "backend", "value", "target", title="sandboxes")
    backends = result.get("backends") or {name: {"problem": problem} for name, problem in doctor().items()}
    for name in ("docker", "bwrap"):
        entry = backends[name]
        if entry["problem"] is not None:
            table.add_row("(unavailable)", name, entry["problem"] or "", "")
            continue
        table.add_row("warm acquire p50 / p99", name, f"{entry['acquire_p50_ms']:.3f} / {entry['acquire_p99_ms']:.3f} ms", "p50 <= 5 ms")
    if "bwrap_exec" in result:
        r = result["bwrap_exec"]
        table.add_row("python3 -c pass: bwrap / bare subprocess", "bwrap", f"{r['ours_ms']:.1f} / {r['bare_ms']:.1f} ms = {r['ratio']:.2f}x", "<= 1.5x")
    if "docker_exec" in result:
        r = result["docker_exec"]
        table.add_row("python3 -c pass: our exec / raw SDK exec_run", "docker", f"{r['ours_ms']:.1f} / {r['raw_ms']:.1f} ms = {r['ratio']:.2f}x", "<= 1.2x")
    for name in ("docker", "bwrap"):
        if backends[name].get("episodes_per_s") is not None:
            table.add_row(f"{result['episodes']} concurrent tool-use episodes", name, f"{backends[name]['episodes_per_s']:.2f} episodes/s", "")
    Console().print(table)


if __name__ == "__main__":
    main()
