"""MediaSource: exactly-one-of construction, content hashes, equality."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pytest

from relax_gym.omni import MediaError, MediaSource
from relax_gym.omni.source import hash_file


def _write(path: Path, data: bytes, mtime_ns: int | None = None) -> Path:
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_exactly_one_of_path_data_array(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        MediaSource()
    with pytest.raises(ValueError):
        MediaSource(path=tmp_path / "x", data=b"x")
    with pytest.raises(ValueError):
        MediaSource(data=b"x", array=np.zeros(3))


def test_of_dispatches_on_type(tmp_path: Path) -> None:
    assert MediaSource.of(tmp_path / "a.png").path == tmp_path / "a.png"
    assert MediaSource.of(str(tmp_path / "a.png")).path == tmp_path / "a.png"
    assert MediaSource.of(b"abc").data == b"abc"
    assert MediaSource.of(bytearray(b"abc")).data == b"abc"
    arr = np.zeros(4, np.float32)
    src = MediaSource.of(arr, rate=8_000)
    assert src.array is arr and src.rate == 8_000
    assert MediaSource.of(src) is src


def test_relative_path_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    src = MediaSource.of("clip.mp4")
    assert src.path.is_absolute() and src.path == tmp_path / "clip.mp4"
    assert src.name == str(tmp_path / "clip.mp4")


def test_path_and_bytes_of_same_content_hash_equal(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # spans several read chunks
    path = _write(tmp_path / "blob.bin", data)
    expected = hashlib.blake2b(data, digest_size=16).hexdigest()
    assert MediaSource.of(path).content_hash == expected
    assert MediaSource.of(data).content_hash == expected
    assert hash_file(path) == expected
    other = _write(tmp_path / "other name.bin", data)
    assert MediaSource.of(other).content_hash == expected


def test_different_bytes_hash_differently(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", b"hello world")
    b = _write(tmp_path / "b", b"hello worle")
    assert MediaSource.of(a).content_hash != MediaSource.of(b).content_hash
    assert MediaSource.of(b"x").content_hash != MediaSource.of(b"y").content_hash


def test_changing_the_file_changes_the_hash(tmp_path: Path) -> None:
    path = _write(tmp_path / "f.bin", b"version one", mtime_ns=1_000_000_000_000_000_000)
    h1 = MediaSource.of(path).content_hash
    assert MediaSource.of(path).content_hash == h1  # unchanged file, same hash
    _write(path, b"version two", mtime_ns=1_000_000_001_000_000_000)  # same size, new content and mtime
    h2 = MediaSource.of(path).content_hash
    assert h2 != h1
    assert h2 == hashlib.blake2b(b"version two", digest_size=16).hexdigest()
    _write(path, b"a longer third version", mtime_ns=1_000_000_002_000_000_000)
    h3 = MediaSource.of(path).content_hash
    assert h3 not in (h1, h2)


def test_missing_file_hash_raises_media_error(tmp_path: Path) -> None:
    with pytest.raises(MediaError) as info:
        hash_file(tmp_path / "gone.bin")
    assert str(tmp_path / "gone.bin") in str(info.value)


def test_array_hash_depends_on_values_dtype_shape_and_rate() -> None:
    base = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    h = MediaSource.of(base, rate=10.0).content_hash
    assert MediaSource.of(base.copy(), rate=10.0).content_hash == h
    variants = {
        "values": MediaSource.of(base + 1, rate=10.0),
        "dtype": MediaSource.of(base.view(np.int8), rate=10.0),  # same bytes, other dtype
        "shape": MediaSource.of(base.reshape(4, 3, 2), rate=10.0),  # same bytes, other shape
        "rate": MediaSource.of(base, rate=12.5),
        "no rate": MediaSource.of(base),
    }
    hashes = {name: src.content_hash for name, src in variants.items()}
    assert h not in hashes.values()
    assert len(set(hashes.values())) == len(hashes)


def test_array_hash_ignores_memory_layout() -> None:
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    strided = base[:, ::2]
    assert not strided.flags.c_contiguous
    assert MediaSource.of(strided, rate=1.0).content_hash == MediaSource.of(strided.copy(), rate=1.0).content_hash
    fortran = np.asfortranarray(base)
    assert MediaSource.of(fortran).content_hash == MediaSource.of(base).content_hash


def test_equality_and_hashing(tmp_path: Path) -> None:
    p = tmp_path / "x.png"
    assert MediaSource.of(p) == MediaSource.of(str(p))
    assert hash(MediaSource.of(p)) == hash(MediaSource.of(str(p)))
    assert MediaSource.of(p) != MediaSource.of(tmp_path / "y.png")
    assert MediaSource.of(b"abc") == MediaSource.of(b"abc")
    assert MediaSource.of(b"abc") != MediaSource.of(b"abd")
    a = np.ones((2, 2), np.float32)
    assert MediaSource.of(a, rate=2.0) == MediaSource.of(a.copy(), rate=2.0)
    assert MediaSource.of(a, rate=2.0) != MediaSource.of(a, rate=3.0)
    assert len({MediaSource.of(a, rate=2.0), MediaSource.of(a.copy(), rate=2.0), MediaSource.of(b"abc")}) == 2


def test_integer_and_float_rate_are_the_same_source() -> None:
    """A rate of 16000 and 16000.0 is the same rate: equal sources must have equal content hashes (the decode
    cache keys on the hash, and JSON round trips turn an int rate into a float)."""
    a = np.zeros(100, np.float32)
    int_rate, float_rate = MediaSource.of(a, rate=16_000), MediaSource.of(a, rate=16_000.0)
    assert int_rate.content_hash == float_rate.content_hash
    assert int_rate == float_rate
    assert hash(int_rate) == hash(float_rate)


def test_names_and_mime(tmp_path: Path) -> None:
    assert MediaSource.of(b"12345", mime="image/png").name == "<5 bytes image/png>"
    assert MediaSource.of(b"12345").name == "<5 bytes>"
    assert MediaSource.of(np.zeros((2, 3), np.uint8)).name == "<array uint8 (2, 3)>"
    assert MediaSource.of(tmp_path / "a.png").guess_mime() == "image/png"
    assert MediaSource.of(tmp_path / "a.mp4").guess_mime() == "video/mp4"
    assert MediaSource.of(b"x", mime="audio/wav").guess_mime() == "audio/wav"
    assert MediaSource.of(b"x").guess_mime() is None


def test_raw_and_npy_bytes(tmp_path: Path) -> None:
    assert MediaSource.of(tmp_path / "a").raw() == tmp_path / "a"
    assert MediaSource.of(b"abc").raw() == b"abc"
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    src = MediaSource.of(arr)
    with pytest.raises(TypeError):
        src.raw()
    np.testing.assert_array_equal(np.load(io.BytesIO(src.npy_bytes()), allow_pickle=False), arr)
