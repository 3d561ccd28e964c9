"""Env reset latency: p50 of reset() (which decodes the observation's media) with a cold decode cache and with
a warm one, for nextqa-video and echo-ink on their bundled samples, and for nextqa-video on NExT-QA-sized clips
(640x480, 30 fps, 20 s, written here in the NExT-QA layout). Run: `python benchmarks/env_reset.py`;
``run(quick)`` returns the figures as a dict (quick: fewer resets and two large clips instead of four)."""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.envs.datasets.nextqa import COLUMNS
from relax_gym.envs.synth import write_moving_square_video
from relax_gym.omni import default_cache


def p50_reset_ms(env, seeds: range, *, cold: bool) -> float:
    times = []
    for seed in seeds:
        if cold:
            default_cache.clear()
        t0 = time.perf_counter()
        env.reset(seed=seed)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def write_large_nextqa(root: Path, clips: int = 4) -> Path:
    (root / "videos").mkdir(parents=True)
    rows = []
    for i in range(clips):
        vid = f"{5000000000 + i}"
        write_moving_square_video(root / "videos" / f"{vid}.mp4", "right", width=640, height=480, fps=30.0, frames=600, seed=i)
        rows.append({"video": vid, "frame_count": 600, "width": 640, "height": 480, "question": "which way does the red square move",
                     "answer": 1, "qid": i, "type": "TN", "a0": "left", "a1": "right", "a2": "up", "a3": "down", "a4": "it stays still"})
    with (root / "val.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return root


def run(quick: bool = False, *, resets: int | None = None) -> dict:
    """Measure every case; returns ``{"resets": N, "cases": [{"label", "env", "cold_p50_ms", "cached_p50_ms",
    "cold_over_cached"}, ...]}``. ``resets`` per measurement (default 40, quick 10); the large clips get a fifth."""
    resets = resets or (10 if quick else 40)
    cases_out = []
    with tempfile.TemporaryDirectory() as tmp:
        large = str(write_large_nextqa(Path(tmp), clips=2 if quick else 4))
        cases = [("nextqa-video", "nextqa-video", {}), ("echo-ink", "echo-ink", {}),
                 ("nextqa-video 640x480 30fps 20s", "nextqa-video", {"data_dir": large})]
        for label, env_id, kwargs in cases:
            env = relax_gym.make(env_id, **kwargs)
            seeds = range(resets if not kwargs else max(4, resets // 5))
            p50_reset_ms(env, seeds, cold=False)  # warm-up: sample generation, imports, file hashes
            cold = p50_reset_ms(env, seeds, cold=True)
            p50_reset_ms(env, seeds, cold=False)  # fills the cache with every clip these seeds pick
            cached = p50_reset_ms(env, seeds, cold=False)
            env.close()
            cases_out.append({"label": label, "env": env_id, "cold_p50_ms": cold, "cached_p50_ms": cached,
                              "cold_over_cached": cold / cached})
    return {"resets": resets, "cases": cases_out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--resets", type=int, default=40, help="resets per measurement")
    args = parser.parse_args()
    table = Table("env", "cold p50 (ms)", "cached p50 (ms)", "cold / cached", title="env reset (decode included)")
    for case in run(resets=args.resets)["cases"]:
        table.add_row(case["label"], f"{case['cold_p50_ms']:.2f}", f"{case['cached_p50_ms']:.3f}",
                      f"{case['cold_over_cached']:.1f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
