"""Rollout records (relax_gym/trainer/run/rollout_records.py): the JSON line of an episode, media stored once across
a group and within the run's cap, tool calls parsed, and the conversation the episode runner keeps for them."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile
from PIL import Image

import relax_gym
from relax_gym.omni import AudioPart, ImagePart, Message, TextPart, VideoPart
from relax_gym.trainer.rollout.episode import Trajectory, run_episode
from relax_gym.trainer.rollout.program_episode import program_conversation
from relax_gym.trainer.run.rollout_records import (
    MediaStore,
    RolloutRecorder,
    episode_record,
    step_file,
    webm,
)
from tests.trainer.test_rollout import ScriptedEngine

CALL = '<think>look closer</think><tool_call>{"name": "zoom", "arguments": {"x": 0, "y": 0, "w": 16, "h": 16}}</tool_call>'


def media_parts(seed: int = 0):
    rng = np.random.default_rng(seed)
    video = VideoPart.of(rng.integers(0, 255, (16, 31, 45, 3), dtype=np.uint8), fps_of_array=8.0, fps=4.0)
    audio = AudioPart.of((0.3 * np.sin(np.arange(8000) / 5)).astype(np.float32), rate_of_array=16000)
    image = ImagePart.of(rng.integers(0, 255, (24, 40, 3), dtype=np.uint8))
    return video, audio, image


def trajectory(group: int = 0, seed: int = 5, parts=None) -> Trajectory:
    video, audio, image = parts or media_parts()
    traj = Trajectory(group_id=group, seed=seed, input_ids=list(range(60)), loss_mask=[0] * 45 + [1] * 15,
                      reward=0.75, reward_breakdown={"accuracy": 1.0, "format": 0.5}, turns=2, completion_tokens=15,
                      weight_versions=["3", "4"], weight_version="4")
    traj.conversation = [
        Message("system", "answer with a letter"),
        Message("user", (TextPart("what happens?"), video, audio, image)),
        Message("assistant", CALL + " and then"),
        Message("tool", "<tool_response>\nhere is the region\n</tool_response>", name="zoom"),
        Message("assistant", '<tool_call>{"name": 3}</tool_call><answer>B</answer>'),
    ]
    return traj


def lines(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in step_file(run_dir, step).read_text().splitlines()]


def media_files(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "media").rglob("*") if p.is_file())


def test_record_fields_and_json_round_trip(tmp_path):
    recorder = RolloutRecorder(tmp_path, per_step=4, media_mb=16)
    assert recorder.write(7, "train", [trajectory()], trained_version=5) == 1
    (record,) = lines(tmp_path, 7)
    assert json.loads(json.dumps(record)) == record
    assert {k: record[k] for k in ("step", "kind", "index", "group", "seed", "reward", "status", "turns")} == {
        "step": 7, "kind": "train", "index": 0, "group": 0, "seed": 5, "reward": 0.75, "status": "ok", "turns": 2}
    assert record["reward_breakdown"] == {"accuracy": 1.0, "format": 0.5}
    assert record["policy_versions"] == ["3", "4"] and record["policy_version"] == 3 and record["staleness"] == 2
    assert (record["prompt_tokens"], record["completion_tokens"]) == (45, 15)
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert record["messages"][3]["name"] == "zoom"


def test_tool_calls_are_parsed_and_set_apart(tmp_path):
    recorder = RolloutRecorder(tmp_path, per_step=1, media_mb=16)
    recorder.write(1, "eval", [trajectory()])
    (record,) = lines(tmp_path, 1)
    first = record["messages"][2]["parts"]
    assert first == [{"type": "text", "text": "<think>look closer</think>"},
                     {"type": "tool_call", "name": "zoom", "arguments": {"x": 0, "y": 0, "w": 16, "h": 16}},
                     {"type": "text", "text": " and then"}]
    bad, answer = record["messages"][4]["parts"]
    assert bad["type"] == "tool_call" and "name" not in bad and "JSON object" in bad["error"]
    assert answer == {"type": "text", "text": "<answer>B</answer>"}
    assert record["tools"] == ["zoom"] and record["tool_calls"] == 2 and record["tool_errors"] == 1


def test_media_are_written_once_across_a_group_and_decode(tmp_path):
    parts = media_parts()
    group = [trajectory(group=0, seed=5, parts=parts) for _ in range(4)]
    RolloutRecorder(tmp_path, per_step=4, media_mb=16).write(2, "train", group)
    records = lines(tmp_path, 2)
    assert len(records) == 4 and [r["index"] for r in records] == [0, 1, 2, 3]
    urls = {tuple(p["url"] for p in r["messages"][1]["parts"][1:]) for r in records}
    assert len(urls) == 1, "every member of the group points at the same files"
    files = media_files(tmp_path)
    assert len(files) == 3 and {f.suffix for f in files} == {".webm", ".wav", ".png"}
    video, audio, image = records[0]["messages"][1]["parts"][1:]
    assert video["mime"] == "video/webm" and video["frames"] == 8 and video["timestamps"][0] == pytest.approx(0.125)
    assert (video["width"], video["height"]) == (45, 31)
    with av.open(str(tmp_path / video["url"])) as clip:
        stream = clip.streams.video[0]
        assert stream.codec_context.name in ("vp8", "libvpx")
        assert len(list(clip.decode(stream))) == 8
    wave, rate = soundfile.read(tmp_path / audio["url"])
    assert rate == 16000 and len(wave) == 8000 and audio["mime"] == "audio/wav"
    assert Image.open(tmp_path / image["url"]).size == (40, 24) and image["mime"] == "image/png"


def test_train_episodes_are_sampled_eval_episodes_all_kept(tmp_path):
    recorder = RolloutRecorder(tmp_path, per_step=3, media_mb=16)
    trajs = [trajectory(group=i // 2, seed=i) for i in range(6)]
    assert recorder.write(4, "train", trajs[:2]) == 2  # an env worker's first group
    assert recorder.write(4, "train", trajs[2:4], first_index=2) == 1  # the second: only index 2 is within 3
    assert recorder.write(4, "train", trajs[4:], first_index=4) == 0
    assert recorder.write(4, "eval", trajs) == 6
    records = lines(tmp_path, 4)
    assert [(r["kind"], r["index"]) for r in records] == [("train", 0), ("train", 1), ("train", 2)] + [("eval", i) for i in range(6)]
    assert RolloutRecorder(tmp_path, per_step=0, media_mb=16).write(5, "train", trajs) == 0


def test_media_cap_is_respected(tmp_path):
    budget_kb = 20  # room for the image and the short clip, not for the 16 kB of audio on top
    recorder = RolloutRecorder(tmp_path, per_step=8, media_mb=budget_kb / 1024)
    recorder.write(1, "train", [trajectory(parts=media_parts(seed)) for seed in range(3)])
    used = sum(f.stat().st_size for f in media_files(tmp_path))
    assert used <= budget_kb * 1024
    parts = [p for r in lines(tmp_path, 1) for p in r["messages"][1]["parts"][1:]]
    omitted = [p for p in parts if "omitted" in p]
    assert omitted and all("metrics.rollout_media_mb" in p["omitted"] for p in omitted)
    assert all("url" in p for p in parts if "omitted" not in p)
    # a new writer of the same run (a resumed run, another env worker) counts the files already there
    later = RolloutRecorder(tmp_path, per_step=8, media_mb=budget_kb / 1024)
    later.write(2, "train", [trajectory(parts=media_parts(9))])
    assert sum(f.stat().st_size for f in media_files(tmp_path)) <= budget_kb * 1024
    assert lines(tmp_path, 2)[0]["reward"] == 0.75, "the record is written without its media"
    # media stored before the cap was reached are still linked, by a writer that did not store them
    RolloutRecorder(tmp_path, per_step=8, media_mb=budget_kb / 1024).write(3, "train", [trajectory(parts=media_parts(0))])
    before = [p.get("url") for p in lines(tmp_path, 1)[0]["messages"][1]["parts"][1:]]
    again = [p.get("url") for p in lines(tmp_path, 3)[0]["messages"][1]["parts"][1:]]
    assert any(before) and again == before


def test_undecodable_media_become_a_note(tmp_path):
    broken = ImagePart.of(b"not an image at all", mime="image/png")
    traj = trajectory()
    traj.conversation = [Message("user", (TextPart("look"), broken))]
    record = episode_record(traj, step=1, kind="eval", index=0, media=MediaStore(tmp_path, 2**20))
    (_, part) = record["messages"][0]["parts"]
    assert part["type"] == "image" and "could not be stored" in part["omitted"]


def test_a_failing_writer_never_raises(tmp_path):
    (tmp_path / "rollouts").write_text("a file where the folder should be")
    assert RolloutRecorder(tmp_path, per_step=1, media_mb=1).write(1, "train", [trajectory()]) == 0


def test_webm_pads_odd_sizes_and_keeps_the_frame_times():
    frames = np.zeros((3, 5, 7, 3), dtype=np.uint8)
    data = webm(frames, [0.5, 1.0, 2.0])
    with av.open(io.BytesIO(data)) as clip:
        decoded = list(clip.decode(video=0))
    assert [(f.width, f.height) for f in decoded] == [(8, 6)] * 3
    assert [round(float(f.time), 2) for f in decoded] == [0.0, 0.5, 1.5]


def test_the_episode_runner_keeps_the_conversation(tmp_path):
    from relax_gym.trainer.policy import build_policy

    processor = build_policy()[1]
    env = relax_gym.make("echo-ink-agent")
    _, info = env.reset(seed=2)
    plan, done = [], False
    while not done:  # the env's gold plan: listen, zoom, answer
        plan.append(info["gold"])
        _, _, terminated, truncated, info = env.step(plan[-1])
        done = terminated or truncated
    traj = asyncio.run(run_episode(env, ScriptedEngine(processor, plan), processor, seed=2, group_id=0,
                                   sampling_params={"max_new_tokens": 64}))
    roles = [m.role for m in traj.conversation]
    assert roles.count("assistant") == traj.turns == len(plan) and "tool" in roles
    assert [m.text for m in traj.conversation if m.role == "assistant"] == plan
    RolloutRecorder(tmp_path, per_step=1, media_mb=16).write(1, "train", [traj])
    (record,) = lines(tmp_path, 1)
    kinds = {p["type"] for m in record["messages"] for p in m["parts"]}
    assert {"image", "audio", "tool_call"} <= kinds and record["tools"]


def test_program_episodes_show_media_and_replies():
    class Call:
        def __init__(self, text, media=()):
            self.text, self.media = text, media

    _, audio, image = media_parts()
    conversation = program_conversation([Call("first"), Call(CALL, (image, audio))])
    assert [m.role for m in conversation] == ["user", "assistant", "assistant"]
    assert conversation[0].media() == [image, audio] and conversation[2].text == CALL
    assert program_conversation([]) == []


def test_an_agent_programs_record_says_how_it_ended_and_what_it_wrote_to_stderr(tmp_path):
    """The program's exit, calls, first refused request and stderr tail (trajectory_from_calls keeps them in the
    trajectory's info) are in its record, for `relax-gym view`; an episode of another kind has no agent object."""
    from types import SimpleNamespace

    from relax_gym.trainer.rollout.program_episode import STDERR_KEPT, trajectory_from_calls

    said = "x" * 2000 + "\nTraceback (most recent call last):\nopenai.NotFoundError: 404 no route /v1/responses\n"
    outcome = SimpleNamespace(reward=0.0, reward_breakdown={}, status="env_error", error="made no model call",
                              info={"agent_rc": 1, "agent_timed_out": False, "agent_stderr_tail": said,
                                    "agent_first_http_error": "404 for POST /v1/responses: no route"})
    traj = trajectory_from_calls([], outcome, seed=3, group_id=1)
    recorder = RolloutRecorder(tmp_path, per_step=4, media_mb=16)
    assert recorder.write(2, "train", [traj, trajectory()], trained_version=2) == 2
    agent, other = lines(tmp_path, 2)
    assert agent["agent"] == {"exit_status": 1, "timed_out": False, "model_calls": 0, "segments": 0,
                              "first_http_error": "404 for POST /v1/responses: no route",
                              "stderr_tail": said[-STDERR_KEPT:]}
    assert agent["agent"]["stderr_tail"].endswith("404 no route /v1/responses\n") and "agent" not in other


def test_the_env_worker_writes_records_of_the_episodes_it_plays(tmp_path):
    """Async mode: each env-worker replica writes the records of its groups (under the step that trains them, with
    their place in the step) and of the eval chunks it is told the step of."""
    from relax_gym.trainer.async_engine.roles.env_worker import EnvWorkerRole
    from relax_gym.trainer.databus import make_bus
    from relax_gym.trainer.policy import build_policy
    from relax_gym.trainer.rollout.samples import sample_id
    from tests.trainer.async_engine.roles.test_streaming_roles import G, config
    from tests.trainer.async_engine.roles.test_streaming_roles import ScriptedEngine as AnswerEngine

    async def main():
        bus = make_bus("inprocess")
        cfg = config().model_dump(mode="json")
        cfg["metrics"]["rollouts_per_step"] = G + 1  # the first group and one member of the second
        worker = EnvWorkerRole(cfg, bus, AnswerEngine(build_policy()[1]), pool_size=2, eval_pool_size=1,
                               run_dir=str(tmp_path))
        await bus.open_partition(0, expected_rows=2 * G, group_size=G)
        for group in (1, 0):  # groups end in any order
            await worker.run_group(0, group, [11 + group] * G, [sample_id(1, group, m) for m in range(G)])
        await worker.evaluate([500_000], step=1, first_index=3)
        await worker.evaluate([500_001])  # no step given: no records

    asyncio.run(main())
    records = sorted(lines(tmp_path, 1), key=lambda r: (r["kind"], r["index"]))
    assert [(r["kind"], r["index"], r["group"]) for r in records] == [
        ("eval", 3, 0), *(("train", m, 0) for m in range(G)), ("train", G, 1)]
    assert all(r["messages"][-1]["role"] == "assistant" for r in records if r["kind"] == "train")
    assert [p.name for p in (tmp_path / "rollouts").iterdir()] == ["step_000001.jsonl"]
