"""The checkpoint module on its own: random states, the data cursor, atomic folders, the latest one, rewinding
metrics.jsonl, and the clear errors of a resume that cannot work."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch

from relax_gym.trainer.run.checkpoint import (
    STATE_FILE,
    CheckpointError,
    CheckpointWriteError,
    TrainerState,
    capture_rng,
    check_cursor,
    data_cursor,
    latest_checkpoint,
    load_checkpoint,
    resume_point,
    restore_rng,
    rewind_metrics,
    save_checkpoint,
)
from relax_gym.trainer.config import TrainerSection


class TinyActor:
    """A model + optimizer that saves itself the way a backend does (its own file), for the protocol."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)

    def save_checkpoint(self, directory):
        torch.save(self.model.state_dict(), directory / "tiny.pt")

    def load_checkpoint(self, directory):
        self.model.load_state_dict(torch.load(directory / "tiny.pt"))

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.model(torch.ones(1, 3)).sum().backward()
        self.optimizer.step()


def draws(gen: np.random.Generator) -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1)), float(gen.random())


def test_random_states_come_back_exactly():
    gen = np.random.default_rng(7)
    states = capture_rng(gen)
    first = draws(gen)
    draws(gen)  # move every generator on
    restore_rng(states, gen)
    assert draws(gen) == first
    with pytest.raises(CheckpointError, match="random generator"):
        restore_rng({k: v for k, v in states.items() if k != "generator"}, gen)


def test_the_data_cursor_names_the_next_step_seeds_and_refuses_another_stream(tmp_path):
    t = TrainerSection(seed=3, prompts_per_step=4, group_size=2)
    cursor = data_cursor(t, 5)
    assert cursor == {"step": 5, "seed": 3, "prompts_per_step": 4, "group_size": 2, "next_seed_base": 3 * 10_000_019 + 6_000}
    check_cursor(cursor, t, tmp_path)
    with pytest.raises(CheckpointError, match="trainer.group_size=2, but the config says 4"):
        check_cursor(cursor, TrainerSection(seed=3, prompts_per_step=4, group_size=4), tmp_path)


def test_save_and_load_restore_model_optimizer_and_state(tmp_path):
    actor = TinyActor()
    actor.step()
    state = TrainerState(step=2, version=3, cursor=data_cursor(TrainerSection(), 2), rng=capture_rng(), elapsed_s=1.5,
                         extra={"produced": ["s000001-g0000-00"]})
    path = save_checkpoint(tmp_path, actor, state)
    assert path.name == "step_000002" and not list(tmp_path.glob("checkpoints/*.partial"))
    other = TinyActor(seed=1)
    loaded = load_checkpoint(path, other)
    assert all(torch.equal(a, b) for a, b in zip(actor.model.state_dict().values(), other.model.state_dict().values()))
    assert other.optimizer.state_dict()["state"][0]["step"] == 1  # Adam's moments and step came back
    actor.step(), other.step()
    assert all(torch.equal(a, b) for a, b in zip(actor.model.parameters(), other.model.parameters()))
    assert (loaded.step, loaded.version, loaded.elapsed_s, loaded.extra) == (2, 3, 1.5, {"produced": ["s000001-g0000-00"]})


def test_latest_checkpoint_ignores_partial_and_foreign_folders(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    actor = TinyActor()
    for step in (2, 10):
        save_checkpoint(tmp_path, actor, TrainerState(step, step, data_cursor(TrainerSection(), step), capture_rng()))
    (tmp_path / "checkpoints" / "step_000020.partial").mkdir()  # a crash while writing step 20
    (tmp_path / "checkpoints" / "step_000030").mkdir()  # no trainer state: not a checkpoint
    assert latest_checkpoint(tmp_path).name == "step_000010"


def _state(step: int) -> TrainerState:
    return TrainerState(step, step, data_cursor(TrainerSection(), step), capture_rng())


def test_a_failed_write_leaves_nothing_and_the_previous_checkpoint_usable(tmp_path, monkeypatch):
    """Disk full, simulated as torch's writer reports it (a RuntimeError, not an OSError) while writing the
    trainer state, the last file of a checkpoint; the staged critic part goes too."""
    actor = TinyActor()
    save_checkpoint(tmp_path, actor, _state(2))
    staged = tmp_path / "checkpoints" / "step_000004.critic.staged"
    staged.mkdir(parents=True)
    (staged / "value_head.safetensors").write_bytes(b"x")
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if str(f).endswith(STATE_FILE):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"step 4 .*RuntimeError.*last complete checkpoint is step_000002"):
        save_checkpoint(tmp_path, actor, _state(4), parts={"critic": staged})
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]
    assert latest_checkpoint(tmp_path).name == "step_000002"
    assert load_checkpoint(latest_checkpoint(tmp_path), TinyActor(seed=1)).step == 2


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root")
def test_a_really_full_disk_is_a_checkpoint_write_error(tmp_path):
    """A tmpfs too small for the second checkpoint: the write fails for real (ENOSPC), the first stays usable."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(run_dir)], check=True)
    try:
        save_checkpoint(run_dir, TinyActor(), _state(1))

        class BigActor(TinyActor):
            def save_checkpoint(self, directory):
                torch.save({"w": torch.zeros(64 * 1024)}, directory / "big.pt")  # 256 KiB

        with pytest.raises(CheckpointWriteError, match="step 2 .*last complete checkpoint is step_000001"):
            save_checkpoint(run_dir, BigActor(), _state(2))
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001"]
        assert load_checkpoint(latest_checkpoint(run_dir), TinyActor(seed=1)).step == 1
    finally:
        subprocess.run(["umount", str(run_dir)], check=True)


def test_rewind_keeps_warmup_eval_and_steps_up_to_the_checkpoint(tmp_path):
    lines = [{"step": -2}, {"step": -1}, {"step": 0}, {"step": 1}, {"step": 2}, {"step": 3}]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "rew'  # the crash cut the last line
    (tmp_path / "metrics.jsonl").write_text(text)
    assert rewind_metrics(tmp_path, 2) == 2
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [-2, -1, 0, 1, 2]
    assert rewind_metrics(tmp_path, None) == 5 and (tmp_path / "metrics.jsonl").read_text() == ""


def test_resume_point_needs_a_run_directory_and_rewinds_to_its_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        resume_point(tmp_path, TrainerSection())
    (tmp_path / "config.json").write_text("{}")
    records = tmp_path / "rollouts"
    records.mkdir()

    def write_run(steps: range) -> None:
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))
        for s in steps:
            if s >= 0:
                (records / f"step_{s:06d}.jsonl").write_text(json.dumps({"kind": "eval" if s == 0 else "train"}) + "\n")

    write_run(range(-1, 5))
    assert resume_point(tmp_path, TrainerSection()).path is None  # nothing saved: start over, every row dropped
    assert (tmp_path / "metrics.jsonl").read_text() == "" and not list(records.iterdir())  # and every record
    save_checkpoint(tmp_path, TinyActor(), TrainerState(3, 4, data_cursor(TrainerSection(), 3), capture_rng()))
    write_run(range(-1, 5))
    point = resume_point(tmp_path, TrainerSection())
    assert point.step == 3 and point.state.version == 4
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [-1, 0, 1, 2, 3]
    # the replayed step's records go with its row: step 4 is written anew
    assert sorted(p.name for p in records.iterdir()) == [f"step_{s:06d}.jsonl" for s in range(4)]
    with pytest.raises(CheckpointError, match="trainer.seed=0, but the config says 9"):
        resume_point(tmp_path, TrainerSection(seed=9))
