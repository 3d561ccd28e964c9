"""The cache of generated samples (relax_gym/envs/samples.py): generated once, reused, honouring
``RELAX_GYM_CACHE``, never half-written (a lost race or a failed writer leaves nothing behind)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relax_gym.envs import samples, synth


@pytest.fixture
def small_writers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ensure_sample generate tiny datasets and record each generation."""
    calls: list[str] = []
    real_nextqa, real_avqa = synth.write_nextqa_sample, synth.write_avqa_sample

    def nextqa(dest: Path) -> None:
        calls.append("nextqa")
        real_nextqa(dest, n_val=2, n_train=2)

    def avqa(dest: Path) -> None:
        calls.append("avqa")
        real_avqa(dest, n_valid=3, n_train=3)

    monkeypatch.setattr(synth, "write_nextqa_sample", nextqa)
    monkeypatch.setattr(synth, "write_avqa_sample", avqa)
    return calls


def test_ensure_sample_caches(tmp_path: Path, small_writers: list[str]) -> None:
    first = samples.ensure_sample("avqa", root=tmp_path)
    assert first == tmp_path / f"avqa-v{synth.SAMPLE_VERSION}"
    marker = first / "valid" / "omni_rl_format_valid.json"
    mtime = marker.stat().st_mtime_ns
    dir_mtime = first.stat().st_mtime_ns
    second = samples.ensure_sample("avqa", root=tmp_path)
    assert second == first
    assert marker.stat().st_mtime_ns == mtime
    assert first.stat().st_mtime_ns == dir_mtime
    assert small_writers == ["avqa"]
    # nothing but the dataset is left in the parent (no temp folders)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    assert oct(first.stat().st_mode & 0o777) == oct(0o755)


def test_ensure_sample_honours_cache_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_writers: list[str]
) -> None:
    monkeypatch.setenv("RELAX_GYM_CACHE", str(tmp_path / "cache"))
    assert samples.sample_root() == tmp_path / "cache" / "samples"
    path = samples.ensure_sample("nextqa")
    assert path == tmp_path / "cache" / "samples" / f"nextqa-v{synth.SAMPLE_VERSION}"
    assert (path / "val.csv").is_file() and (path / "map_vid_vidorID.json").is_file()
    assert small_writers == ["nextqa"]

    monkeypatch.delenv("RELAX_GYM_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert samples.sample_root() == tmp_path / "home" / ".cache" / "relax-gym" / "samples"


def test_ensure_sample_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nextqa") as info:
        samples.ensure_sample("imagenet", root=tmp_path)
    assert "avqa" in str(info.value)
    assert not any(tmp_path.iterdir())


def test_ensure_sample_lost_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If another process renames its copy into place first, ours is discarded and theirs kept."""
    final = tmp_path / f"avqa-v{synth.SAMPLE_VERSION}"

    def racing_writer(dest: Path) -> None:
        (dest / "ours.txt").write_text("ours")
        final.mkdir()
        (final / "theirs.txt").write_text("theirs")

    monkeypatch.setattr(synth, "write_avqa_sample", racing_writer)
    assert samples.ensure_sample("avqa", root=tmp_path) == final
    assert sorted(p.name for p in final.iterdir()) == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_ensure_sample_failure_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(dest: Path) -> None:
        (dest / "partial.txt").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setattr(synth, "write_nextqa_sample", broken)
    with pytest.raises(RuntimeError, match="boom"):
        samples.ensure_sample("nextqa", root=tmp_path)
    assert not any(tmp_path.iterdir())
    assert not os.path.exists(tmp_path / f"nextqa-v{synth.SAMPLE_VERSION}")
