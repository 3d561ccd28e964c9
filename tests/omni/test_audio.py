"""Audio decoding: soundfile (wav/flac), PyAV (aac in m4a/mp4), arrays; mono mixing, resampling, slicing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from relax_gym.omni import AudioPart, AudioSampling, MediaError
from relax_gym.omni.decode import decode_audio, resample

from .media import peak_hz, tone, wav_bytes, write_aac


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_stereo_is_mixed_to_mono_by_mean(tmp_path: Path, suffix: str) -> None:
    rate = 16_000
    left, right = tone(500.0, 1.0, rate, 0.6), tone(1500.0, 1.0, rate, 0.2)
    path = tmp_path / f"st{suffix}"
    sf.write(path, np.stack([left, right], axis=1), rate)
    a = AudioPart.of(path, sample_rate=rate).decode(cache=None)
    assert a.waveform.dtype == np.float32 and a.waveform.shape == (rate,)
    assert a.sample_rate == rate
    np.testing.assert_allclose(a.waveform, (left + right) / 2, atol=2e-4)  # 16-bit PCM quantisation
    assert not a.waveform.flags.writeable


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_resample_44100_to_16000_keeps_duration_and_pitch(tmp_path: Path, suffix: str) -> None:
    rate = 44_100
    left, right = tone(1000.0, 2.0, rate, 0.5), tone(300.0, 2.0, rate, 0.2)
    path = tmp_path / f"st44{suffix}"
    sf.write(path, np.stack([left, right], axis=1), rate)
    a = AudioPart.of(path).decode(cache=None)  # default 16 kHz
    assert a.sample_rate == 16_000
    assert abs(len(a.waveform) - 32_000) <= 16
    assert a.duration_s == pytest.approx(2.0, abs=1e-3)
    assert peak_hz(a.waveform, 16_000) == pytest.approx(1000.0, abs=3.0)
    assert np.abs(a.waveform).max() == pytest.approx(0.35, abs=0.03)  # (0.5 + 0.2) / 2 at the peaks


def test_resample_function() -> None:
    x = tone(440.0, 1.0, 48_000)
    y = resample(x, 48_000, 8_000)
    assert y.dtype == np.float32
    assert abs(len(y) - 8_000) <= 8
    assert peak_hz(y, 8_000) == pytest.approx(440.0, abs=2.0)
    assert resample(np.zeros(0, np.float32), 48_000, 8_000).shape == (0,)


def test_start_end_slicing_is_exact(tmp_path: Path) -> None:
    rate = 16_000
    ramp = (np.arange(2 * rate, dtype=np.float32) / (2 * rate)).astype(np.float32)  # 0 .. 1 over 2 s
    path = tmp_path / "ramp.wav"
    sf.write(path, ramp, rate, subtype="FLOAT")
    a = AudioPart.of(path, sample_rate=rate, start_s=0.5, end_s=1.25).decode(cache=None)
    np.testing.assert_array_equal(a.waveform, ramp[8_000:20_000])
    tail = AudioPart.of(path, sample_rate=rate, start_s=1.5).decode(cache=None)
    np.testing.assert_array_equal(tail.waveform, ramp[24_000:])
    capped = AudioPart.of(path, sample_rate=rate, start_s=0.25, max_seconds=0.5).decode(cache=None)
    np.testing.assert_array_equal(capped.waveform, ramp[4_000:12_000])
    past_end = AudioPart.of(path, sample_rate=rate, end_s=10.0).decode(cache=None)
    assert len(past_end.waveform) == 2 * rate


def test_slicing_then_resampling(tmp_path: Path) -> None:
    rate = 44_100
    wave = np.concatenate([tone(500.0, 1.0, rate), tone(2000.0, 1.0, rate)])
    path = tmp_path / "two_tones.flac"
    sf.write(path, wave, rate)
    first = AudioPart.of(path, end_s=1.0).decode(cache=None)
    second = AudioPart.of(path, start_s=1.0).decode(cache=None)
    assert first.duration_s == pytest.approx(1.0, abs=1e-3) and second.duration_s == pytest.approx(1.0, abs=1e-3)
    assert peak_hz(first.waveform, 16_000) == pytest.approx(500.0, abs=3.0)
    assert peak_hz(second.waveform, 16_000) == pytest.approx(2000.0, abs=3.0)


@pytest.mark.parametrize("suffix,channels", [(".m4a", 1), (".mp4", 1), (".m4a", 2)])
def test_aac_audio_only_file_via_pyav(tmp_path: Path, suffix: str, channels: int) -> None:
    path = write_aac(tmp_path / f"tone{suffix}", tone(660.0, 1.5, 44_100), 44_100, channels=channels)
    a = AudioPart.of(path).decode(cache=None)
    assert a.waveform.dtype == np.float32 and a.waveform.ndim == 1
    assert a.sample_rate == 16_000
    assert a.duration_s == pytest.approx(1.5, abs=0.05)
    assert peak_hz(a.waveform, 16_000) == pytest.approx(660.0, abs=4.0)
    sliced = AudioPart.of(path, start_s=0.5, end_s=1.0, sample_rate=8_000).decode(cache=None)
    assert sliced.sample_rate == 8_000
    assert len(sliced.waveform) == pytest.approx(4_000, abs=2)
    assert peak_hz(sliced.waveform, 8_000) == pytest.approx(660.0, abs=4.0)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def test_aac_stereo_is_mixed_like_wav_stereo(tmp_path: Path) -> None:
    """Mono mixing is the channel mean whatever the decoder: the same stereo content (both channels equal) must
    come out at the same level from an AAC .m4a (PyAV) as from a .wav (soundfile), and stay within [-1, 1]."""
    rate = 16_000
    wave = tone(440.0, 1.0, rate, 0.9)
    m4a = write_aac(tmp_path / "loud_stereo.m4a", wave, rate, channels=2)
    wav = tmp_path / "loud_stereo.wav"
    sf.write(wav, np.stack([wave, wave], axis=1), rate)
    from_wav = AudioPart.of(wav).decode(cache=None).waveform
    from_m4a = AudioPart.of(m4a).decode(cache=None).waveform
    assert _rms(from_wav) == pytest.approx(0.9 / np.sqrt(2), rel=0.02)
    assert _rms(from_m4a) == pytest.approx(_rms(from_wav), rel=0.1)
    assert np.abs(from_m4a).max() <= 1.0


def test_aac_bytes_source(tmp_path: Path) -> None:
    path = write_aac(tmp_path / "tone.m4a", tone(880.0, 1.0, 22_050), 22_050)
    from_path = AudioPart.of(path).decode(cache=None)
    from_bytes = AudioPart.of(path.read_bytes()).decode(cache=None)
    np.testing.assert_array_equal(from_path.waveform, from_bytes.waveform)


def test_audio_from_video_file(clip_with_audio: Path) -> None:
    a = AudioPart.of(clip_with_audio, sample_rate=16_000).decode(cache=None)
    assert a.duration_s == pytest.approx(3.0, abs=0.05)
    assert peak_hz(a.waveform, 16_000) == pytest.approx(440.0, abs=3.0)


def test_wav_bytes_source_sniffed_by_magic() -> None:
    wave = tone(750.0, 0.5, 16_000)
    a = AudioPart.of(wav_bytes(wave, 16_000)).decode(cache=None)
    np.testing.assert_array_equal(a.waveform, wave)
    b = decode_audio(wav_bytes(wave, 16_000), AudioSampling(sample_rate=16_000))
    np.testing.assert_array_equal(b.waveform, wave)


def test_array_source_mono_and_stereo() -> None:
    wave = tone(1234.0, 1.0, 44_100)
    a = AudioPart.of(wave, rate_of_array=44_100).decode(cache=None)
    assert a.sample_rate == 16_000 and abs(len(a.waveform) - 16_000) <= 8
    assert peak_hz(a.waveform, 16_000) == pytest.approx(1234.0, abs=3.0)
    stereo = np.stack([wave, np.zeros_like(wave)], axis=1)
    s = AudioPart.of(stereo, rate_of_array=44_100, sample_rate=44_100).decode(cache=None)
    np.testing.assert_allclose(s.waveform, wave / 2, atol=1e-7)
    f64 = AudioPart.of(wave.astype(np.float64), rate_of_array=44_100, sample_rate=44_100).decode(cache=None)
    assert f64.waveform.dtype == np.float32
    np.testing.assert_allclose(f64.waveform, wave, atol=1e-7)


def test_array_source_slicing() -> None:
    rate = 1_000
    ramp = np.arange(3 * rate, dtype=np.float32) / (3 * rate)
    a = AudioPart.of(ramp, rate_of_array=rate, sample_rate=rate, start_s=1.0, end_s=2.0).decode(cache=None)
    np.testing.assert_array_equal(a.waveform, ramp[1_000:2_000])


def test_array_source_start_past_end_raises() -> None:
    with pytest.raises(MediaError, match="past the end"):
        AudioPart.of(np.zeros(100, np.float32), rate_of_array=100, start_s=5.0).decode(cache=None)


@pytest.mark.parametrize("shape", [(100,), (100, 2)])
def test_integer_array_is_rejected(shape: tuple[int, ...]) -> None:
    """Arrays must be float (the decoded waveform is documented to lie in [-1, 1]); an int16 array, mono or
    multi-channel, is refused rather than passed through at int16 scale."""
    wave = np.full(shape, 20_000, np.int16)
    with pytest.raises(MediaError, match="float"):
        AudioPart.of(wave, rate_of_array=16_000).decode(cache=None)


def test_decoded_array_audio_does_not_alias_the_callers_array() -> None:
    """Decoded (cached, shared) waveforms are read-only; they must not be a view of the caller's writable array,
    or a later write by the caller silently changes every cached copy."""
    wave = np.linspace(-0.5, 0.5, 1_000).astype(np.float32)
    a = AudioPart.of(wave, rate_of_array=16_000, sample_rate=16_000).decode(cache=None)
    before = a.waveform.copy()
    wave[:] = 0.0
    np.testing.assert_array_equal(a.waveform, before)
