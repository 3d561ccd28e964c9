"""Served env overhead: N episodes (reset + gold-action steps) of the same env in this process and through its
env server (started automatically by a ``[server] python = <this interpreter>`` manifest, as a child process on
loopback), with media by reference and inline; prints served / in-process time (medians
per episode, the two played in turn) and the overhead per episode.
Run: `python benchmarks/remote_env.py [--episodes N]`; ``run(quick)`` returns the figures as a dict (quick: fewer
episodes)."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.envs import discover
from relax_gym.envs.registry import ENV_PATH_VAR, builtin_registry_dir
from relax_gym.envs.remote import launcher

ENVS = ("image-zoom", "nextqa-video")  # a tool env whose tool returns image arrays; a data env with video files


def play(env, seed: int) -> float:
    """Milliseconds for one episode: reset, then the gold action until the episode ends."""
    t0 = time.perf_counter()
    _, info = env.reset(seed=seed)
    done = False
    while not done:
        _, _, terminated, truncated, info = env.step(info["gold"])
        done = terminated or truncated
    return (time.perf_counter() - t0) * 1e3


def interleaved(local, served, seeds: range) -> tuple[float, float]:
    """Median ms per episode of each env, the two played in turn on the same seeds (so load swings hit both)."""
    a, b = [], []
    for seed in seeds:
        a.append(play(local, seed))
        b.append(play(served, seed))
    return statistics.median(a), statistics.median(b)


def served_manifests(folder: Path, env_ids: tuple[str, ...]) -> None:
    """``<id>-served``: the built-in manifest, served by a child process running this interpreter."""
    for env_id in env_ids:
        text = (builtin_registry_dir() / env_id / "env.toml").read_text()
        text = re.sub(r'^id = "[^"]+"', f'id = "{env_id}-served"', text, count=1, flags=re.MULTILINE)
        (folder / env_id).mkdir()
        (folder / env_id / "env.toml").write_text(f"{text}\n[server]\npython = {sys.executable!r}\n".replace("'", '"'))


def run(quick: bool = False, *, episodes: int | None = None) -> dict:
    """``{"episodes", "cpus", "load_before", "load_after", "cases": [{"env", "media", "in_process_ms", "served_ms",
    "served_over_in_process", "overhead_ms"}], "server_start_s"}``; ``episodes`` per case (default 60, quick 15)."""
    episodes = episodes or (15 if quick else 60)
    load_before = os.getloadavg()
    cases, start_s = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        served_manifests(Path(tmp), ENVS)
        os.environ[ENV_PATH_VAR] = os.pathsep.join(filter(None, [os.environ.get(ENV_PATH_VAR), tmp]))
        discover(force=True)
        try:
            for env_id in ENVS:
                local = relax_gym.make(env_id)
                t0 = time.perf_counter()
                relax_gym.make(f"{env_id}-served").close()  # starts the server
                start_s[env_id] = time.perf_counter() - t0
                for media in ("ref", "inline"):
                    served = relax_gym.make(f"{env_id}-served", remote_media=media)
                    interleaved(local, served, range(episodes))  # warm-up: samples, file hashes, connections
                    in_ms, served_ms = interleaved(local, served, range(episodes))
                    served.close()
                    cases.append({"env": env_id, "media": media, "in_process_ms": in_ms, "served_ms": served_ms,
                                  "served_over_in_process": served_ms / in_ms, "overhead_ms": served_ms - in_ms})
                local.close()
        finally:
            launcher.stop_all()
    return {"episodes": episodes, "cpus": os.cpu_count(), "load_before": load_before[0], "load_after": os.getloadavg()[0],
            "cases": cases, "server_start_s": start_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=60, help="episodes per case")
    args = parser.parse_args()
    result = run(episodes=args.episodes)
    table = Table("env", "media", "in-process (ms/episode)", "served (ms/episode)", "served / in-process", "overhead (ms/episode)",
                  title=f"served env vs in-process, {result['episodes']} episodes each (reset + gold steps)")
    for c in result["cases"]:
        table.add_row(c["env"], c["media"], f"{c['in_process_ms']:.2f}", f"{c['served_ms']:.2f}",
                      f"{c['served_over_in_process']:.2f}x", f"{c['overhead_ms']:.2f}")
    console = Console()
    console.print(table)
    console.print("server start-up: " + ", ".join(f"{k} {v:.1f} s" for k, v in result["server_start_s"].items())
                  + f"; {result['cpus']} CPUs, 1-min load {result['load_before']:.2f} before, {result['load_after']:.2f} after")


if __name__ == "__main__":
    main()
