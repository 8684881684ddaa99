"""`omniflow synth speed=` and a batch line's `speed`: the file is stretched to the length,
and an out-of-range speed is one line and exit status 2 (a bad batch line: reported)."""

from __future__ import annotations

import json

import pytest
import soundfile

from omniflow.cli import main

ARGS = ["synth", "pipeline=qwen3_tts", "platform=cpu", "text=Hello there.", "seed=7"]
FIXED = ["max_new_tokens=6", "ignore_eos=true"]  # exactly 6 frames of 1,920 samples


def test_synth_writes_the_stretched_length(tmp_path):
    out = tmp_path / "slow.wav"
    assert main([*ARGS, *FIXED, f"out={out}", "speed=0.5"]) == 0
    audio, rate = soundfile.read(out)
    assert rate == 24000 and audio.size == 2 * 6 * 1920


@pytest.mark.parametrize("speed", ["0.2", "4.5"])
def test_out_of_range_speed_is_one_line_and_exit_2(tmp_path, capsys, speed):
    out = tmp_path / "x.wav"
    assert main([*ARGS, *FIXED, f"out={out}", f"speed={speed}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "synth.speed" in lines[0], lines
    assert not out.exists()


def test_batch_lines_carry_their_speed(tmp_path, capsys):
    texts = tmp_path / "in.jsonl"
    lines = [
        {"id": "plain", "text": "Hello there.", "seed": 1},
        {"id": "fast", "text": "Hello there.", "seed": 1, "speed": 2.0},
        {"id": "bad", "text": "Hello there.", "speed": 9},
    ]
    texts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    out.mkdir()
    assert main(["synth", "platform=cpu", f"texts={texts}", f"out_dir={out}"]) == 1
    assert "line 3: " in capsys.readouterr().err
    plain, _ = soundfile.read(out / "plain.wav")
    fast, _ = soundfile.read(out / "fast.wav")
    assert fast.size == round(plain.size / 2.0) and not (out / "bad.wav").exists()
