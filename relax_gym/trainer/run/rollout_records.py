"""Rollout records: a sample of each RL step's episodes written as JSON lines, with their media, for ``relax-gym view``.

Metrics say how a run goes; they do not say what the policy did. So each step writes
``RUN_DIR/rollouts/step_NNNNNN.jsonl``: every eval episode of the step and its first ``metrics.rollouts_per_step``
train episodes (in seed order, so whole groups: the members of a group share a prompt and differ in what the policy
sampled, which is what the advantages compare). One line per episode (:func:`episode_record`): the conversation
with roles, the assistant's ``<tool_call>`` blocks parsed (:mod:`relax_gym.omni.tool_calls`) and set apart from its
text, the media as links into ``RUN_DIR/media/``, and the episode's reward, breakdown, status, error, policy
versions, staleness, token counts, turns, seed and group, and its ``timing`` (seconds: the reset, each engine call,
each env step, the whole episode; ``relax-gym plan calibrate`` fits per-turn costs from them); an agent program's
episode adds an ``agent`` object (:func:`agent_record`: exit status, time-out, calls, the first refused request,
the tail of its stderr).

Media are stored once (:class:`MediaStore`), keyed by the source's content hash and the sampling spec (the same
clip watched over two spans is two files; the same picture shown to every member of a group is one): video as the
frames the policy saw, encoded as a short WebM (VP8, which browsers play) with the frame timestamps in the record;
audio as 16-bit WAV; images as PNG (JPEG above 256x256 pixels). Disk use is bounded: once ``RUN_DIR/media`` holds
``metrics.rollout_media_mb`` the store writes no new file and the record says so in place of the media (the text
and figures of every episode are still written; a line is a few kilobytes).

Nothing here may stop training: the trainer calls :meth:`RolloutRecorder.write`, which logs a failure and goes on.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.omni.parts import Message, TextPart
from relax_gym.omni.tool_calls import BadToolCall, find_tool_calls

__all__ = ["RECORD_SCHEMA", "MediaStore", "RolloutRecorder", "agent_record", "episode_record", "message_record", "rewind_rollouts",
           "step_file"]

log = logging.getLogger(__name__)

RECORD_SCHEMA = 1
ROLLOUTS_DIR = "rollouts"
MEDIA_DIR = "media"
PNG_MAX_PIXELS = 256 * 256  # larger pictures are stored as JPEG (a tenth of the bytes for photos)
ENTRIES_KEPT = 10_000  # record entries of stored media remembered per process (to skip decoding them again)


def step_file(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / ROLLOUTS_DIR / f"step_{step:06d}.jsonl"


def rewind_rollouts(run_dir: str | os.PathLike, step: int | None) -> int:
    """Remove the record files of the steps after ``step`` (``step`` None: every file, for a run that starts over),
    as :func:`~relax_gym.trainer.run.checkpoint.rewind_metrics` drops their rows: a resumed or restarted run plays
    those steps again and writes them anew. Their media stay (other records may link them). Returns how many files
    went."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    removed = 0
    for path in sorted(folder.glob("step_*.jsonl")) if folder.is_dir() else []:
        try:
            file_step = int(path.stem.removeprefix("step_"))
        except ValueError:
            continue
        if step is None or file_step > step:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _train_lines(path: Path) -> int:
    """Train records already in a step's file."""
    try:
        with open(path, encoding="utf-8") as f:
            return sum('"kind": "train"' in line for line in f)
    except FileNotFoundError:
        return 0


class MediaStore:
    """Writes media parts under ``RUN_DIR/media/`` once each, within a byte budget shared by the run.

    ``put(part)`` answers the part's record entry: ``url`` (relative to the run directory), ``mime`` and what the
    viewer shows beside it (size, frame timestamps, duration); or, past the budget or for media that cannot be
    decoded, an entry with ``omitted`` saying why. The budget counts the files already in the folder (measured by
    :meth:`measure`, once per batch of records), so several writers of one run (the async env workers) overshoot it
    by one batch each at most."""

    def __init__(self, run_dir: str | os.PathLike, budget_bytes: int) -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / MEDIA_DIR
        self.budget = int(budget_bytes)
        self.used = 0
        self._entries: dict[str, dict[str, Any]] = {}  # key -> entry, for parts this process has stored

    def measure(self) -> int:
        """Bytes in the media folder now (other writers of the run count too)."""
        total = 0
        if self.root.is_dir():
            for sub in os.scandir(self.root):
                if sub.is_dir():
                    total += sum(f.stat().st_size for f in os.scandir(sub.path) if f.is_file())
        self.used = total
        return total

    @property
    def full(self) -> bool:
        return self.used >= self.budget

    def put(self, part: Any) -> dict[str, Any]:
        kind = part.kind
        try:
            key = media_key(part)
        except Exception as exc:  # noqa: BLE001 - an unreadable source: the record says so
            return {"type": kind, "omitted": f"cannot read the media: {type(exc).__name__}: {exc}"}
        if key in self._entries:
            return dict(self._entries[key])
        if self.full and not any((self.root / key[:2]).glob(f"{key}.*")):  # stored before: still linked
            return {"type": kind, "omitted": f"not stored: the run's media cap ({self.budget / 2**20:.0f} MB, "
                                             "metrics.rollout_media_mb) is reached"}
        try:
            files, entry = _encode(part)
        except Exception as exc:  # noqa: BLE001 - MediaError, an encoder's error: this part only
            return {"type": kind, "omitted": f"could not be stored: {type(exc).__name__}: {exc}"}
        urls = {role: f"{MEDIA_DIR}/{key[:2]}/{key}{suffix}" for role, (suffix, _) in files.items()}
        new = sum(len(data) for role, (_, data) in files.items() if not (self.run_dir / urls[role]).exists())
        if new and self.used + new > self.budget:
            self.used = self.budget
            return self.put(part)
        for role, (_, data) in files.items():
            if not (self.run_dir / urls[role]).exists():
                _write_atomic(self.run_dir / urls[role], data)
        self.used += new
        entry = {"type": kind, "url": urls["main"], "bytes": sum(len(d) for _, d in files.values()), **entry}
        if "audio" in urls:
            entry["audio_url"] = urls["audio"]
        if len(self._entries) >= ENTRIES_KEPT:  # a long run's media: a file seen again is then decoded again, not rewritten
            self._entries.clear()
        self._entries[key] = entry
        return dict(entry)


def media_key(part: Any) -> str:
    """The file name of a part's stored media: what it shows (the source's content hash) as it was sampled."""
    spec = part.sampling.cache_key()
    return hashlib.blake2b(f"{part.kind}|{part.content_hash}|{spec}".encode(), digest_size=16).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _encode(part: Any) -> tuple[dict[str, tuple[str, bytes]], dict[str, Any]]:
    """The files of a part (``main``, and ``audio`` for a video with its sound track: file suffix and bytes) and
    its entry's metadata."""
    if part.kind == "image":
        data, ext, entry = _encode_image(part.decode())
        return {"main": (f".{ext}", data)}, entry
    if part.kind == "audio":
        audio = part.decode()
        return {"main": (".wav", _wav(audio.waveform, audio.sample_rate))}, {
            "mime": "audio/wav", "sample_rate": int(audio.sample_rate), "duration_s": round(float(audio.duration_s), 3),
            "start_s": float(part.sampling.start_s)}
    video = part.decode()
    frames = np.asarray(video.frames)
    times = [round(float(t), 3) for t in video.timestamps]
    files = {"main": (".webm", webm(frames, times))}
    entry: dict[str, Any] = {"mime": "video/webm", "frames": len(frames), "timestamps": times,
                             "width": int(frames.shape[2]), "height": int(frames.shape[1]),
                             "duration_s": round(float(video.duration_s), 3)}
    if video.audio is not None:  # the clip's sound track as the policy heard it, beside the frames
        files["audio"] = ("-audio.wav", _wav(video.audio.waveform, video.audio.sample_rate))
        entry["audio_mime"] = "audio/wav"
    return files, entry


def _encode_image(pixels: np.ndarray) -> tuple[bytes, str, dict[str, Any]]:
    from PIL import Image

    h, w = pixels.shape[:2]
    buf = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(pixels))
    if h * w <= PNG_MAX_PIXELS:
        image.save(buf, format="PNG")
        ext, mime = "png", "image/png"
    else:
        image.save(buf, format="JPEG", quality=90)
        ext, mime = "jpg", "image/jpeg"
    return buf.getvalue(), ext, {"mime": mime, "width": int(w), "height": int(h)}


def _wav(waveform: np.ndarray, sample_rate: int) -> bytes:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.clip(np.asarray(waveform, dtype=np.float32), -1.0, 1.0), int(sample_rate),
                    format="WAV", subtype="PCM_16")
    return buf.getvalue()


def webm(frames: np.ndarray, timestamps: Sequence[float]) -> bytes:
    """Frames (T, H, W, 3) uint8 as a WebM (VP8) clip, each frame shown from its timestamp (relative to the first):
    the clip plays the frames the policy saw at the times they were taken. Odd sizes are padded by a pixel (VP8's
    4:2:0 chroma needs even ones)."""
    import av

    frames = np.asarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or len(frames) == 0:
        raise ValueError(f"a video needs frames (T, H, W, 3), got shape {frames.shape}")
    _, h, w, _ = frames.shape
    pad_h, pad_w = h % 2, w % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    ms = [max(0, round((float(t) - float(timestamps[0])) * 1000)) for t in timestamps]
    ms = [max(m, i and ms[i - 1] + 1) for i, m in enumerate(ms)]  # strictly increasing presentation times
    buf = io.BytesIO()
    with av.open(buf, "w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=1000)
        stream.width, stream.height, stream.pix_fmt = w + pad_w, h + pad_h, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.options = {"crf": "10", "b:v": "2M", "auto-alt-ref": "0"}
        for pixels, pts in zip(frames, ms):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


# -- records ---------------------------------------------------------------------------------------------------------


def message_record(message: Message, media: MediaStore) -> dict[str, Any]:
    """One message as the viewer shows it: ``parts`` in order — ``text``; ``tool_call`` (an assistant's parsed
    ``<tool_call>`` block: ``name`` and ``arguments``, or ``error`` and ``raw`` for one that could not be read);
    ``image`` / ``video`` / ``audio`` (see :class:`MediaStore`). Tool messages keep their ``name``."""
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts += _assistant_parts(part.text) if message.role == "assistant" else [{"type": "text", "text": part.text}]
        else:
            parts.append(media.put(part))
    out: dict[str, Any] = {"role": message.role, "parts": parts}
    if message.name:
        out["name"] = message.name
    return out


def _assistant_parts(text: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    at = 0
    for span in find_tool_calls(text):
        if span.start > at:
            parts.append({"type": "text", "text": text[at:span.start]})
        call = span.call
        if isinstance(call, BadToolCall):
            parts.append({"type": "tool_call", "error": call.error, "raw": call.raw})
        else:
            parts.append({"type": "tool_call", "name": call.name, "arguments": call.arguments})
        at = span.end
    if at < len(text) or not parts:
        parts.append({"type": "text", "text": text[at:]})
    return parts


def episode_record(traj: Any, conversation: Iterable[Message] | None = None, *, step: int, kind: str, index: int,
                   media: MediaStore, staleness: int | None = None) -> dict[str, Any]:
    """One episode's JSON record. ``traj``: a :class:`~relax_gym.trainer.rollout.episode.Trajectory` (read only);
    ``conversation``: its messages (default ``traj.conversation``); ``index``: its place in the step (train: seed
    order, so ``index // group_size`` is its group); ``staleness``: trained policy version minus the oldest version
    that generated it, where the caller knows it."""
    messages = [message_record(m, media) for m in (conversation if conversation is not None
                                                    else getattr(traj, "conversation", []))]
    calls = [p for m in messages if m["role"] == "assistant" for p in m["parts"] if p["type"] == "tool_call"]
    versions = [str(v) for v in getattr(traj, "weight_versions", [])]
    numeric = [int(v) for v in versions if v.lstrip("-").isdigit()]
    completion = int(getattr(traj, "completion_tokens", 0))
    return {
        "schema": RECORD_SCHEMA, "step": int(step), "kind": kind, "index": int(index),
        "group": int(traj.group_id), "seed": int(traj.seed),
        "reward": float(traj.reward), "reward_breakdown": {k: float(v) for k, v in traj.reward_breakdown.items()},
        "status": traj.status, "error": traj.error, "trainable": bool(traj.trainable),
        "policy_version": min(numeric) if numeric else None, "policy_versions": versions, "staleness": staleness,
        "prompt_tokens": max(0, len(traj.input_ids) - completion), "completion_tokens": completion, "turns": int(traj.turns),
        "tool_calls": len(calls), "tool_errors": sum(1 for c in calls if "error" in c),
        "tools": sorted({c["name"] for c in calls if "name" in c}),
        **({"timing": timing.as_dict()} if (timing := getattr(traj, "timing", None)) is not None else {}),
        **({"agent": agent} if (agent := agent_record(getattr(traj, "info", None) or {})) else {}),
        "messages": messages,
    }


AGENT_FIELDS = {"agent_rc": "exit_status", "agent_timed_out": "timed_out", "agent_calls": "model_calls",
                "agent_segments": "segments", "agent_first_http_error": "first_http_error",
                "agent_stderr_tail": "stderr_tail"}


def agent_record(info: dict[str, Any]) -> dict[str, Any]:
    """What an agent program's episode adds to its record (empty for other episodes): its exit status, whether it
    timed out, its model calls and segments, the first request the endpoint refused, and the tail of its stderr
    (what the program said; :data:`~relax_gym.trainer.rollout.program_episode.STDERR_KEPT` characters at most)."""
    return {name: info[key] for key, name in AGENT_FIELDS.items() if info.get(key) is not None}


class RolloutRecorder:
    """Writes a run's rollout records (see the module doc). ``per_step``: train episodes kept per step (the first
    ones in seed order; 0 keeps none); ``media_mb``: the media cap. Safe to use from several processes of one run:
    each line is appended under an exclusive lock, media are written to a temporary name and renamed."""

    def __init__(self, run_dir: str | os.PathLike, *, per_step: int, media_mb: float, env: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.per_step = int(per_step)
        self.media = MediaStore(self.run_dir, int(media_mb * 2**20))
        self.env = env  # the exact env id (``nextqa-video-v1``) each record names

    def write(self, step: int, kind: str, trajs: Sequence[Any], *, first_index: int = 0,
              trained_version: int | None = None, arrival: bool = False) -> int:
        """Append the records of ``trajs`` (the step's episodes from ``first_index`` on: an env worker's group) to
        the step's file; train episodes past ``per_step`` are left out. ``arrival``: the indices are not positions
        in the step (a carried group's are its launch numbers), so the first ``per_step`` train episodes to arrive
        are kept instead (counted in the step's file; writers racing may each add one group more).
        ``trained_version``: the policy version the step trained (each record's staleness is it minus the episode's
        oldest version). Answers how many lines were written; a failure is logged, never raised (the records are
        for people; training goes on)."""
        try:
            return self._write(step, kind, trajs, first_index, trained_version, arrival)
        except Exception:
            log.warning("could not write the rollout records of step %d (%s)", step, kind, exc_info=True)
            return 0

    def _write(self, step: int, kind: str, trajs: Sequence[Any], first_index: int, trained_version: int | None,
               arrival: bool = False) -> int:
        if kind == "train" and arrival:
            room = self.per_step - _train_lines(step_file(self.run_dir, step))
            chosen = [(first_index + i, t) for i, t in enumerate(trajs)][: max(0, room)]
        else:
            chosen = [(first_index + i, t) for i, t in enumerate(trajs)
                      if kind != "train" or first_index + i < self.per_step]
        if not chosen:
            return 0
        self.media.measure()
        lines = []
        for i, traj in chosen:
            record = episode_record(traj, step=step, kind=kind, index=i, media=self.media)
            if self.env is not None:
                record = {"env": self.env, **record}
            if trained_version is not None and record["policy_version"] is not None:
                record["staleness"] = int(trained_version) - record["policy_version"]
            lines.append(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        path = step_file(self.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.write("".join(lines))
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return len(lines)
