"""`python -m omniflow synth` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import wave


def synth(tmp_path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "omniflow",
            "synth",
            "pipeline=qwen3_tts",
            "platform=cpu",
            "text=Hello there, this is a test.",
            f"out={tmp_path / name}",
            "seed=7",
            "max_new_tokens=24",
            "ignore_eos=true",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_synth_writes_24_frames_deterministically(tmp_path):
    a = synth(tmp_path, "a.wav")
    assert a.returncode == 0, a.stderr
    assert "24/24 frames" in a.stderr  # progress was shown
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == 24 * 1920
    b = synth(tmp_path, "b.wav")
    assert b.returncode == 0, b.stderr
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_synth_fused_pipeline_and_bad_voice(tmp_path):
    r = synth(tmp_path, "f.wav", "pipeline=qwen3_tts_fused")
    assert r.returncode == 0, r.stderr
    with wave.open(str(tmp_path / "f.wav")) as w:
        assert w.getnframes() == 24 * 1920
    bad = synth(tmp_path, "x.wav", "voice=nobody")
    assert bad.returncode == 2 and "unknown voice" in bad.stderr
    assert not (tmp_path / "x.wav").exists()
