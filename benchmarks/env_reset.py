"""Env reset latency: p50 of reset() (which decodes the observation's media) with a cold decode cache and with
a warm one, for nextqa-video and echo-ink on their bundled samples, and for nextqa-video on NExT-QA-sized clips
(640x480, 30 fps, 20 s, written here in the NExT-QA layout).

Then the seeking decoder against camera-like clips (textured, panning, with film grain; 640x480, 30 fps) with
keyframes every 1 s, 2 s and 10 s, 20 s and 60 s long: per clip the cold reset p50 (16 frames picked) and a full
decode of every frame of the same clip with plain PyAV (its default threading), measured alternately, and their
ratio (targets: <= 0.3x at 1 s keyframes, <= 0.5x at 2 s, never above 1.0x). PyAV's default threading is slice
threads (on an idle 2-core machine that full decode keeps both cores about 85 % busy); the seeking decoder shares
its runs among the cores. For reference, a full decode with frame and slice threads ("AUTO") is measured alongside,
with the reset's ratio to it. Last, on the moving-square clips, the seeking decoder against the sequential one
(``decode_video(..., seek=False)``, frame threads), alternately. Both decoders need the cores: on a machine where
other jobs hold one of them, the ratios rise (the seeking decoder's CPU time is about 0.35x of the full decode's
at 1 s keyframes, 0.55x at 2 s, on these clips).

Run: `python benchmarks/env_reset.py`; ``run(quick)`` returns the figures as a dict (quick: fewer resets, two
large clips instead of four, 20 s clips only)."""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

import av
from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.envs.datasets.nextqa import COLUMNS
from relax_gym.envs.synth import write_moving_square_video, write_textured_video
from relax_gym.omni import default_cache
from relax_gym.omni.decode import decode_video

KEYFRAME_S = (1.0, 2.0, 10.0)
TARGET_RATIO = {1.0: 0.3, 2.0: 0.5}  # cold reset / full decode; never above 1.0 anywhere


def p50_reset_ms(env, seeds: range, *, cold: bool) -> float:
    times = []
    for seed in seeds:
        if cold:
            default_cache.clear()
        t0 = time.perf_counter()
        env.reset(seed=seed)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _row(vid: str, i: int, frames: int) -> dict:
    return {"video": vid, "frame_count": frames, "width": 640, "height": 480, "question": "which way does the red square move",
            "answer": 1, "qid": i, "type": "TN", "a0": "left", "a1": "right", "a2": "up", "a3": "down", "a4": "it stays still"}


def _write_csv(root: Path, rows: list[dict]) -> None:
    with (root / "val.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


def write_large_nextqa(root: Path, clips: int = 4) -> Path:
    (root / "videos").mkdir(parents=True)
    rows = []
    for i in range(clips):
        vid = f"{5000000000 + i}"
        write_moving_square_video(root / "videos" / f"{vid}.mp4", "right", width=640, height=480, fps=30.0, frames=600, seed=i)
        rows.append(_row(vid, i, 600))
    _write_csv(root, rows)
    return root


def write_textured_nextqa(root: Path, lengths_s: tuple[float, ...]) -> tuple[Path, list[dict]]:
    """One camera-like clip per (length, keyframe spacing), in the NExT-QA layout; returns the folder and, per
    clip (record order), its label, spacing, length and path."""
    (root / "videos").mkdir(parents=True)
    rows, clips = [], []
    for seconds in lengths_s:
        for key_s in KEYFRAME_S:
            i = len(rows)
            vid = f"{6000000000 + i}"
            path = root / "videos" / f"{vid}.mp4"
            write_textured_video(path, seconds=seconds, keyframe_s=key_s, seed=i)
            rows.append(_row(vid, i, int(seconds * 30)))
            clips.append({"label": f"{seconds:g} s, keyframes every {key_s:g} s", "keyframe_s": key_s, "seconds": seconds,
                          "path": path})
    _write_csv(root, rows)
    return root, clips


def full_decode_ms(path: Path, *, frame_threads: bool = False) -> float:
    """Every frame of the clip through plain PyAV (default threading), as a user without relax-gym would; with
    ``frame_threads``, PyAV's frame and slice threads ("AUTO") instead."""
    t0 = time.perf_counter()
    with av.open(str(path)) as container:
        if frame_threads:
            container.streams.video[0].thread_type = "AUTO"
        for _ in container.decode(video=0):
            pass
    return (time.perf_counter() - t0) * 1e3


def seek_cases(root: Path, repeats: int, lengths_s: tuple[float, ...]) -> list[dict]:
    """Cold nextqa-video resets against full PyAV decodes of the same clip, alternated so both see the same load."""
    data_dir, clips = write_textured_nextqa(root, lengths_s)
    env = relax_gym.make("nextqa-video", data_dir=str(data_dir))
    out = []
    for index, clip in enumerate(clips):
        env.reset(seed=0, options={"index": index})  # warm-up: file hash, imports
        resets, fulls, threaded = [], [], []
        for _ in range(repeats):
            default_cache.clear()
            t0 = time.perf_counter()
            env.reset(seed=0, options={"index": index})
            resets.append((time.perf_counter() - t0) * 1e3)
            fulls.append(full_decode_ms(clip["path"]))
            threaded.append(full_decode_ms(clip["path"], frame_threads=True))
        cold, full, full_threads = statistics.median(resets), statistics.median(fulls), statistics.median(threaded)
        out.append({"label": clip["label"], "keyframe_s": clip["keyframe_s"], "seconds": clip["seconds"],
                    "cold_p50_ms": cold, "full_decode_ms": full, "ratio": cold / full,
                    "target": TARGET_RATIO.get(clip["keyframe_s"], 1.0),
                    "full_frame_threads_ms": full_threads, "ratio_frame_threads": cold / full_threads})
    env.close()
    return out


def seek_vs_sequential(data_dir: Path, spec, repeats: int) -> dict:
    """decode_video of each moving-square clip with the seeking decoder and with the sequential one, alternately
    (no cache involved)."""
    clips = sorted((data_dir / "videos").glob("*.mp4"))
    seeking, sequential = [], []
    for _ in range(repeats):
        for path in clips:
            t0 = time.perf_counter()
            decode_video(path, spec)
            seeking.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            decode_video(path, spec, seek=False)
            sequential.append((time.perf_counter() - t0) * 1e3)
    a, b = statistics.median(seeking), statistics.median(sequential)
    return {"label": "moving-square 640x480 30fps 20s", "seek_p50_ms": a, "sequential_p50_ms": b, "ratio": a / b}


def run(quick: bool = False, *, resets: int | None = None) -> dict:
    """Measure every case; returns ``{"resets": N, "cases": [{"label", "env", "cold_p50_ms", "cached_p50_ms",
    "cold_over_cached"}, ...], "seek": [{"label", "keyframe_s", "seconds", "cold_p50_ms", "full_decode_ms", "ratio",
    "target", "full_frame_threads_ms", "ratio_frame_threads"}, ...], "seek_vs_sequential": {"label", "seek_p50_ms",
    "sequential_p50_ms", "ratio"}}``. ``resets`` per measurement (default 40, quick 10); the large clips get a fifth,
    the seek clips a third (at least 3: a cold reset on a 2-core VM moves by 10-25 % with what ran just before, so
    a median of 4 moved the ratio by a few hundredths from run to run)."""
    resets = resets or (10 if quick else 40)
    cases_out = []
    with tempfile.TemporaryDirectory() as tmp:
        seek = seek_cases(Path(tmp) / "seek", max(3, resets // 3), (20.0,) if quick else (20.0, 60.0))
        large = str(write_large_nextqa(Path(tmp) / "large", clips=2 if quick else 4))
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
            spec = env.unwrapped.video_sampling
        versus = seek_vs_sequential(Path(large), spec, max(2, resets // 10))  # the last env's spec: the large clips'
    return {"resets": resets, "cases": cases_out, "seek": seek, "seek_vs_sequential": versus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--resets", type=int, default=40, help="resets per measurement")
    args = parser.parse_args()
    figures = run(resets=args.resets)
    table = Table("env", "cold p50 (ms)", "cached p50 (ms)", "cold / cached", title="env reset (decode included)")
    for case in figures["cases"]:
        table.add_row(case["label"], f"{case['cold_p50_ms']:.2f}", f"{case['cached_p50_ms']:.3f}",
                      f"{case['cold_over_cached']:.1f}x")
    seek = Table("clip (640x480, 30 fps, textured)", "cold reset p50 (ms)", "full PyAV decode (ms)", "ratio", "target",
                 "full, frame threads (ms)", "ratio to it",
                 title="nextqa-video cold reset (16 frames, seeking decoder) vs a full decode of the clip")
    for c in figures["seek"]:
        seek.add_row(c["label"], f"{c['cold_p50_ms']:.1f}", f"{c['full_decode_ms']:.1f}", f"{c['ratio']:.2f}x",
                     f"<= {c['target']:.1f}x", f"{c['full_frame_threads_ms']:.1f}", f"{c['ratio_frame_threads']:.2f}x")
    v = figures["seek_vs_sequential"]
    versus = Table("clips", "seeking decoder p50 (ms)", "sequential decoder p50 (ms)", "ratio",
                   title="decode_video, 16 frames: seeking vs sequential decoder (no cache)")
    versus.add_row(v["label"], f"{v['seek_p50_ms']:.1f}", f"{v['sequential_p50_ms']:.1f}", f"{v['ratio']:.2f}x")
    console = Console() if Console().is_terminal else Console(width=150)  # a log or pipe: wide rows, no wrapping
    console.print(table)
    console.print(seek)
    console.print(versus)


if __name__ == "__main__":
    main()
