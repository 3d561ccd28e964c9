"""Seek-decoding: decode only the stretches of a video stream that hold the frames a sampling picks.

Picking 16 frames from a 20 s clip by decoding it from end to end spends nearly all of the time on frames nobody
keeps. Here the video stream's packets are first read without decoding (:func:`scan_packets`: demuxing costs a few
per cent of a decode), which gives every frame's presentation time and where the keyframes are. The nearest-frame
rule of the sequential decoder (:func:`relax_gym.omni.decode._pick_frames_linear`) is then applied to those times
(:func:`plan_seek`), so the frames to keep are known before anything is decoded, and each is reached by seeking to
the keyframe that starts its group of pictures and decoding forward from there (:func:`decode_planned`). Picks
that lie close together share one run of decoding instead of seeking again.

A run decodes only what its picks need: frames that nobody picked and nobody refers to are skipped, and after the
run's last needed packet the decoder is drained rather than fed further packets to push out the pictures it holds
back for B-frame reordering. Runs are independent of each other, so they are shared among threads (one per core
at most, in the whole process: :data:`decode_threads`), each with its own container and a single-threaded decoder:
frame threads would restart their pipeline at every seek, which short runs cannot pay back. A plan of one long run
decodes with frame threads instead.

Exactness comes before speed: the result must equal the sequential decoder's, frame for frame. So the plan is made
only where the timestamps can be trusted (every packet has a distinct pts, the stream starts on a keyframe, no
open-GOP leading pictures), and the decoding checks itself: a seek that lands after the keyframe it asked for, a
planned frame that does not come out of the decoder, or a change of frame size makes :func:`decode_planned` give
up (answer None), and the caller decodes sequentially instead. Where the picks are denser than the keyframes, one
run from the start covers them all (:attr:`SeekPlan.mode` is then "linear").
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import av
import numpy as np

log = logging.getLogger(__name__)

# What starting a run costs, in frames decoded: the demuxer repositions and the decoder starts over. A gap of fewer
# frames than this between the end of one run and the next pick's keyframe is decoded through rather than skipped.
SEEK_COST_FRAMES = 6
# Decoders whose "NONREF" skipping drops exactly the frames no other frame refers to. Frames nobody picked and
# nobody refers to are skipped while decoding towards a pick (in H.264 from x264 that is about half the frames).
# Elsewhere every frame is decoded: a codec whose skipping dropped a referenced frame would corrupt the picks
# without any check noticing.
SKIP_NONREF_CODECS = frozenset({"h264", "hevc", "mpeg4", "mpeg2video", "mpeg1video"})


@dataclass(frozen=True)
class PacketIndex:
    """The video stream's packets in decode order, as demuxing alone reports them (nothing decoded).

    ``pts`` and ``dts`` are in the stream's time base; ``keyframe`` marks the packets a decoder can start from.
    ``times`` are the presentation times in seconds, computed exactly as PyAV's ``Frame.time`` computes them, so
    that a plan made from them takes the same decisions the sequential decoder takes from decoded frames.
    """

    pts: tuple[int, ...]
    dts: tuple[int, ...]
    keyframe: tuple[bool, ...]
    times: tuple[float, ...]
    position: dict[int, int]  # pts -> decode position

    def __len__(self) -> int:
        return len(self.pts)

    def keyframe_spacing_s(self) -> float:
        """Mean seconds between keyframes (the whole stream's span when there is only one)."""
        keys = [t for t, k in zip(self.times, self.keyframe) if k]
        span = max(self.times) - min(self.times) if self.times else 0.0
        return span / max(len(keys) - 1, 1) if len(keys) > 1 else span


def scan_packets(container, stream) -> PacketIndex | None:
    """Demux ``stream`` from the container's current position to its end. None when the timestamps cannot carry an
    exact plan: a packet without a pts, two packets with the same pts, a stream that does not start on a keyframe,
    packets the demuxer marks to be discarded (edit lists that cut into a group of pictures), open-GOP leading
    pictures (a frame shown before the keyframe it follows in decode order, which refers to the previous group),
    or times made up from the decode order."""
    if stream.time_base is None:
        return None
    num, den = stream.time_base.numerator, stream.time_base.denominator
    pts: list[int] = []
    dts: list[int] = []
    keyframe: list[bool] = []
    last_key_pts: int | None = None
    for packet in container.demux(stream):
        if packet.size == 0:  # the flush packets PyAV yields at the end
            continue
        if packet.pts is None or packet.is_discard or packet.is_corrupt:
            return None
        is_key = bool(packet.is_keyframe)
        if not pts and not is_key:
            return None
        if is_key:
            last_key_pts = packet.pts
        elif last_key_pts is not None and packet.pts < last_key_pts:
            return None
        pts.append(int(packet.pts))
        dts.append(int(packet.dts) if packet.dts is not None else int(packet.pts))
        keyframe.append(is_key)
    if not pts or len(set(pts)) != len(pts):
        return None
    if stream.codec_context.has_b_frames and all(a < b for a, b in itertools.pairwise(pts)):
        # A decoder that reorders pictures, yet times that never go back in decode order: they were made up from
        # the decode order (AVI stores no presentation times), and do not say which picture is shown when.
        return None
    times = tuple(float(p) * num / den for p in pts)  # PyAV's Frame.time, to the bit
    return PacketIndex(tuple(pts), tuple(dts), tuple(keyframe), times, {p: i for i, p in enumerate(pts)})


@dataclass(frozen=True)
class Run:
    """One stretch of decoding: seek to the keyframe at decode position ``keyframe``, decode forward, and keep the
    frames whose pts are in ``picks`` (ascending). ``last`` is the decode position of the last packet needed."""

    keyframe: int
    picks: tuple[int, ...]
    last: int

    @property
    def frames(self) -> int:
        return self.last - self.keyframe + 1


@dataclass(frozen=True)
class SeekPlan:
    """Which frame (by pts) each target takes, the runs that decode them, and what they cost in frames decoded
    (a seek counted as ``SEEK_COST_FRAMES``) against the sequential decoder's ``linear_frames``."""

    target_pts: tuple[int, ...]
    runs: tuple[Run, ...]
    linear_frames: int
    seek_frames: int

    @property
    def mode(self) -> str:
        """"linear" when one run from the start covers every pick (the picks are denser than the keyframes, so no
        seek pays for itself), else "seek"."""
        return "linear" if len(self.runs) == 1 and self.runs[0].keyframe == 0 else "seek"


def plan_seek(index: PacketIndex, targets: np.ndarray, dt: float) -> SeekPlan | None:
    """Apply the sequential decoder's nearest-frame rule to the indexed frames (the ones it would see): each target takes the first frame, in presentation order, with ``target < t + 0.5005 dt``
    (``target <= t`` without a frame rate); targets past the last frame take the last frame. None when the
    sequential decoder would stop with an error instead (a stream that ends well before the targets: a truncated
    file), so that it is the one to raise it."""
    order = sorted(range(len(index)), key=index.pts.__getitem__)
    if not order or len(targets) == 0:
        return None
    picks: list[int] = []  # decode positions, one per target
    j = 0
    for i in order:
        t = index.times[i]
        while j < len(targets) and (targets[j] < t + dt * 0.5005 if dt else targets[j] <= t):
            picks.append(i)
            j += 1
        if j >= len(targets):
            break
    if j < len(targets):
        last_t = index.times[order[-1]]
        if targets[-1] > last_t + 2 * dt + 0.5:
            return None
        picks.extend([order[-1]] * (len(targets) - j))
    keys = [i for i in range(len(index)) if index.keyframe[i]]
    runs: list[Run] = []
    for i in sorted(set(picks), key=index.pts.__getitem__):
        key = keys[bisect.bisect_right(keys, i) - 1]
        if runs and key <= runs[-1].last + 1 + SEEK_COST_FRAMES:  # cheaper to decode on than to seek
            prev = runs[-1]
            runs[-1] = Run(prev.keyframe, (*prev.picks, index.pts[i]), max(prev.last, i))
        else:
            runs.append(Run(key, (index.pts[i],), i))
    linear = max(picks) + 1
    seek = sum(r.frames for r in runs) + SEEK_COST_FRAMES * len(runs)
    return SeekPlan(tuple(index.pts[i] for i in picks), tuple(runs), linear, seek)


def decode_planned(container, stream, index: PacketIndex, plan: SeekPlan,
                   convert: Callable[[object], np.ndarray], *,
                   reopen: Callable[[], tuple[object, object]] | None = None) -> tuple[list[np.ndarray], list[float]] | None:
    """Run ``plan``: seek to each run's keyframe, decode forward, ``convert`` the planned frames (a decoded
    ``av.VideoFrame`` to an array; it may be called from several threads at once). Returns the frames and their
    times in target order, or None as soon as the stream does not behave as planned (the caller then decodes
    sequentially).

    With ``reopen`` (opens the same file again and returns its container and video stream) and more than one run,
    the runs are shared among up to one decoding thread per core (this caller's and helper threads, each with its
    own container, within :data:`decode_threads`): runs are independent, and PyAV decodes without the GIL. Each
    thread's decoder then runs single-threaded, as it also does where no helper is free. A plan whose longest run
    is more than half of the work (one run from the start, say) cannot be shared out evenly: it is decoded on this
    thread alone, with frame threads."""
    runs = sorted(plan.runs, key=lambda r: r.frames, reverse=True)  # longest first: the threads finish together
    threaded = 2 * runs[0].frames > sum(r.frames for r in runs)
    wanted = len(runs) - 1 if reopen is not None and not threaded else 0
    helpers = decode_threads.enter(wanted)
    try:
        work = collections.deque(runs)
        kept: dict[int, tuple[np.ndarray, float]] = {}
        stop = threading.Event()
        futures = []
        for _ in range(helpers):
            try:
                futures.append(_helper_pool().submit(_helper, reopen, index, work, convert, kept, stop))
            except RuntimeError:  # the interpreter is shutting down: this thread decodes every run
                break
        try:
            ok = _decode_runs(container, stream, index, work, convert, kept, stop, threaded=threaded)
        except BaseException:
            stop.set()
            raise
        finally:
            helper_ok = [f.result() for f in futures]  # the helpers' frames are all in ``kept`` once they return
        if not ok or not all(helper_ok) or stop.is_set():
            return None
    finally:
        decode_threads.leave(helpers)
    return [kept[p][0] for p in plan.target_pts], [kept[p][1] for p in plan.target_pts]


class DecodeThreads:
    """How many threads decode runs of seek plans at once, in the whole process, callers included: at most
    ``limit`` (the cores this process may use). A caller always decodes (it counts itself) and is given helper
    threads only while the total stays within the limit, so concurrent decodes (a decode pool's threads, async
    env workers) never multiply their threads beyond the cores."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.busy = 0
        self._lock = threading.Lock()

    def enter(self, wanted: int) -> int:
        """Count the caller; returns how many helper threads (<= ``wanted``) it may use, counted too."""
        with self._lock:
            self.busy += 1
            extra = max(0, min(wanted, self.limit - self.busy))
            self.busy += extra
            return extra

    def leave(self, helpers: int) -> None:
        with self._lock:
            self.busy -= 1 + helpers


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


decode_threads = DecodeThreads(_cores())
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helper_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, decode_threads.limit - 1), thread_name_prefix="seek-decode")
        return _pool


def _after_fork() -> None:
    """A forked child has none of its parent's threads: a pool whose threads it never started would queue helpers
    forever, and the parent's decodes under way would count against the child's budget."""
    global _pool, _pool_lock, decode_threads
    _pool, _pool_lock, decode_threads = None, threading.Lock(), DecodeThreads(_cores())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _helper(reopen, index, work, convert, kept, stop) -> bool:
    """A helper thread: open the file again and decode runs from the shared queue until it is empty. A file that
    does not open again leaves its runs to the caller; a run that does not go as planned fails the plan."""
    if not work or stop.is_set():
        return True
    try:
        container, stream = reopen()
    except Exception as exc:  # noqa: BLE001 - the caller decodes every run itself then
        log.debug("seek plan: a helper cannot reopen the file: %s", exc)
        return True
    try:
        return _decode_runs(container, stream, index, work, convert, kept, stop, threaded=False)
    except Exception as exc:  # noqa: BLE001 - an error here is the plan failing: the caller decodes sequentially
        log.debug("seek plan: a helper failed: %s: %s", type(exc).__name__, exc)
        stop.set()
        return False
    finally:
        container.close()


def _decode_runs(container, stream, index: PacketIndex, work: collections.deque, convert, kept: dict, stop: threading.Event,
                 *, threaded: bool) -> bool:
    """Take runs from ``work`` and decode them on ``stream`` until none is left (True) or one does not go as
    planned (False; ``stop`` is set so that the other threads stop too)."""
    ctx = stream.codec_context
    if not ctx.is_open:  # nothing decoded on it yet: choose its threads
        ctx.thread_type = "AUTO" if threaded else "SLICE"
        ctx.thread_count = 0 if threaded else 1
    # The sequential decoder sizes every frame as the first it decodes: every kept frame must have the stream's size.
    size = (ctx.width, ctx.height)
    skip = ctx.name in SKIP_NONREF_CODECS
    try:
        while not stop.is_set():
            try:
                run = work.popleft()
            except IndexError:
                return True
            got = _decode_run(container, stream, index, run, convert, size, skip)
            if got is None:
                stop.set()
                return False
            kept.update(got)
        return False
    finally:
        ctx.skip_frame = "DEFAULT"


def _decode_run(container, stream, index: PacketIndex, run: Run, convert, size, skip: bool) -> dict | None:
    packets = _seek_to(container, stream, index, run.keyframe)
    if packets is None:
        return None
    kept: dict[int, tuple[np.ndarray, float]] = {}
    wanted = iter(run.picks)
    want = next(wanted)
    opened = False
    for frame in _run_frames(stream, packets, index, run, skip):
        if not opened:  # a container may flag packets as keyframes that the bitstream does not start over at
            if not frame.key_frame:
                return None
            opened = True
        if frame.pts is None or frame.pts < want:
            continue
        if frame.pts != want:  # the planned frame did not come out of the decoder
            log.debug("seek plan: expected pts %d, the decoder gave %d", want, frame.pts)
            return None
        if (frame.width, frame.height) != size:
            return None
        kept[want] = (convert(frame), float(frame.time))
        want = next(wanted, None)
        if want is None:
            return kept
    return None  # the stream ended first


def _run_frames(stream, packets: Iterator, index: PacketIndex, run: Run, skip: bool) -> Iterator:
    """The frames of one run in presentation order: its packets up to the last one it needs (frames nobody picked
    and nobody refers to skipped), then a drain of the decoder, which hands out the frames it still holds back for
    reordering without decoding any packet past the run (feeding it more until the last pick comes out would decode
    up to two more reference frames)."""
    ctx = stream.codec_context
    picks = set(run.picks)
    for packet in packets:
        if skip:
            ctx.skip_frame = "DEFAULT" if packet.pts in picks else "NONREF"
        yield from ctx.decode(packet)
        if packet.size == 0:  # the demuxer's end-of-stream packet has drained the decoder already
            return
        if index.position.get(packet.pts, -1) >= run.last:
            break
    else:
        return
    drain = av.Packet()
    drain.time_base = stream.time_base  # the frames' time base, as the packets give it
    yield from ctx.decode(drain)


def _seek_to(container, stream, index: PacketIndex, key: int) -> Iterator | None:
    """Position the demuxer on the keyframe at decode position ``key`` or an earlier one (decoding from an earlier
    keyframe is slower but gives the same frames) and return the packets from there on, that keyframe first.
    Demuxers index by pts (mp4) or by dts: the keyframe's pts is tried first, then its dts. None when both land
    after it."""
    for ts in dict.fromkeys((index.pts[key], index.dts[key])):
        container.seek(ts, stream=stream, backward=True, any_frame=False)
        packets = container.demux(stream)
        first = next((p for p in packets if p.size), None)
        if first is None or not first.is_keyframe or first.pts is None:
            continue
        landed = index.position.get(int(first.pts))
        if landed is not None and landed <= key:
            return itertools.chain((first,), packets)
    return None
