"""`omniflow synth texts=LINES.jsonl out_dir=DIR`: many requests through one pipeline, a bad
line reported by number while the rest go on, a rerun resuming, Ctrl-C leaving only whole
files (`omniflow/synth_batch.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import soundfile

from omniflow import cli
from tests.test_cli_errors import omniflow, one_line_error
from tests.test_synth_cli import reference_wav

BASE = ["synth", "pipeline=qwen3_tts_fused", "platform=cpu"]


def write_lines(path, *lines: dict | str) -> str:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_a_batch_writes_a_file_per_good_line_and_names_the_bad_ones(tmp_path):
    texts = write_lines(
        tmp_path / "in.jsonl",
        {"id": "a", "text": "Hello there.", "seed": 1},
        {"id": "b", "text": "Hi.", "voice": "nobody"},
        "not json",
        {"id": "c", "text": "A second sentence, longer.", "seed": 2, "voice": "ryan"},
        {"id": "a", "text": "again"},
    )
    out = tmp_path / "new" / "out"  # made, parents and all
    r = omniflow(*BASE, f"texts={texts}", f"out_dir={out}", "concurrency=2")
    assert r.returncode == 1, r.stderr  # some lines failed
    assert "line 2: " in r.stderr and "nobody" in r.stderr
    assert "line 3: not JSON (Expecting value at column 1)" in r.stderr
    assert "line 5: " in r.stderr and "repeats" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.wav", "c.wav"]
    for name in ("a.wav", "c.wav"):
        audio, rate = soundfile.read(out / name)
        assert rate == 24000 and audio.size > 0
    assert "wrote 2 files" in r.stdout and "3 failed" in r.stdout


def test_a_rerun_skips_what_is_written(tmp_path, capsys):
    """The same command twice, through `omniflow synth`'s entry point in this process (the
    batch as a child process: the test above)."""
    texts = write_lines(tmp_path / "in.jsonl", {"id": "x", "text": "Hello.", "seed": 3})
    out = tmp_path / "out"
    out.mkdir()
    argv = [*BASE, f"texts={texts}", f"out_dir={out}", "format=flac"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    written = (out / "x.flac").stat().st_mtime_ns
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "1 files already written, skipped" in capsys.readouterr().err
    assert (out / "x.flac").stat().st_mtime_ns == written


def test_the_synth_keys_of_a_request_act_on_every_line(tmp_path):
    texts = write_lines(
        tmp_path / "in.jsonl",
        {"id": "a", "text": "Hello there, a sentence of some length.", "seed": 1},
        {"id": "b", "text": "Hello.", "seed": 2, "max_new_tokens": 3},  # its own wins
    )
    out = tmp_path / "out"
    r = omniflow(
        *BASE,
        f"texts={texts}",
        f"out_dir={out}",
        "format=pcm",
        "max_new_tokens=7",
        "ignore_eos=true",
    )
    assert r.returncode == 0, r.stderr
    frame_bytes = 1920 * 2  # 16-bit PCM, 1,920 samples a frame
    assert (out / "a.pcm").stat().st_size == 7 * frame_bytes
    assert (out / "b.pcm").stat().st_size == 3 * frame_bytes


def test_x_vector_only_mode_clones_every_line_or_one(tmp_path):
    ref = reference_wav(tmp_path / "ref.wav")
    texts = write_lines(
        tmp_path / "in.jsonl",
        {"id": "a", "text": "Hello.", "seed": 1, "ref_audio": ref},
        {"id": "b", "text": "Hi.", "seed": 2, "ref_audio": ref, "x_vector_only_mode": True},
    )
    base = ["synth", "model=qwen3_tts_tiny_base", "platform=cpu", f"texts={texts}"]
    alone = omniflow(*base, f"out_dir={tmp_path / 'one'}")
    assert alone.returncode == 1 and "line 1: " in alone.stderr  # no transcript, no mode
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["b.wav"]
    every = omniflow(*base, f"out_dir={tmp_path / 'all'}", "x_vector_only_mode=true")
    assert every.returncode == 0, every.stderr
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["a.wav", "b.wav"]


def test_batch_keys_act_only_in_a_batch_and_one_request_keys_not_in_one(tmp_path):
    texts = write_lines(tmp_path / "in.jsonl", {"id": "x", "text": "Hello."})
    one_line_error(omniflow(*BASE, f"out_dir={tmp_path}"), "synth.out_dir", "synth.texts")
    one_line_error(omniflow(*BASE, "concurrency=4"), "synth.concurrency")
    one_line_error(omniflow(*BASE, f"texts={texts}"), "synth.out_dir")
    one_line_error(
        omniflow(*BASE, f"texts={texts}", f"out_dir={tmp_path}", "text=Hi"), "synth.text"
    )
    one_line_error(omniflow(*BASE, f"texts={texts}", f"out_dir={texts}"), "synth.out_dir")
    # at its batch value too: accepted beside out=x.mp3, it would be ignored
    one_line_error(omniflow(*BASE, "format=wav"), "synth.format", "acts only in a batch")
    at_default = omniflow(*BASE, f"texts={texts}", f"out_dir={tmp_path}", "out=out.wav")
    one_line_error(at_default, "synth.out", "each line of synth.texts has its own")
    both = omniflow(*BASE, f"texts={texts}", "text=Hi")  # every conflict at once
    assert both.returncode == 2 and "2 configuration errors" in both.stderr, both.stderr
    assert "synth.out_dir:" in both.stderr and "synth.text:" in both.stderr


def test_a_line_without_an_id_says_so(tmp_path):
    texts = write_lines(tmp_path / "in.jsonl", {"text": "Hello."}, {"text": "x", "seconds": 2})
    r = omniflow(*BASE, f"texts={texts}", f"out_dir={tmp_path / 'o'}")
    assert r.returncode == 1 and "line 1: no 'id'" in r.stderr, r.stderr
    assert "line 2: unknown keys ['seconds'] (and no 'id')" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_leaves_only_whole_files(tmp_path, sig):
    lines = [{"id": f"n{i}", "text": "A sentence. " * 8, "seed": i} for i in range(30)]
    texts = write_lines(tmp_path / "in.jsonl", *lines)
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "omniflow", *BASE, f"texts={texts}", f"out_dir={out}"]
    proc = subprocess.Popen(
        [*cmd, "concurrency=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not any(p.suffix == ".wav" for p in out.iterdir()):  # wait for the first file
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    names = [p.name for p in out.iterdir()]
    assert f"interrupted; {len(names)} of 30 files written, each whole" in err, err
    assert names and all(n.endswith(".wav") and not n.startswith(".") for n in names)
    for n in names:
        assert soundfile.read(out / n)[0].size > 0  # each one complete
    assert len(names) < 30


def test_a_bad_lines_text_is_named_text_as_the_line_names_it_not_input(tmp_path):
    """The server's rules say `input` (the HTTP field); a batch line's field is `text`."""
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph
    from omniflow.synth_batch import read_lines

    texts = write_lines(
        tmp_path / "in.jsonl",
        {"id": "blank", "text": "   "},
        {"id": "none"},
        {"id": "long", "text": "x" * 5000},
        {"id": "ok", "text": "Hello."},
    )
    spec = compose([*BASE[1:], f"synth.texts={texts}", f"synth.out_dir={tmp_path / 'out'}"])
    items, bad = read_lines(spec, build_graph(spec))
    assert [i.out.name for i in items] == ["ok.wav"]
    assert bad[0].startswith("line 1: text is empty")
    assert bad[1].startswith("line 2: text: ")
    assert bad[2].startswith("line 3: text is 5000 characters")
    assert not any("input" in b for b in bad)


def test_a_bad_line_reports_its_id_and_its_requests_broken_rules_at_once(tmp_path):
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph
    from omniflow.synth_batch import read_lines

    texts = write_lines(
        tmp_path / "in.jsonl",
        {"id": "ok", "text": "Hello."},
        {"id": "bad voice", "text": "Hi.", "voice": "nobody"},
        {"id": "ok", "text": "   ", "language": "klingon"},
        {"text": "no id"},
    )
    spec = compose([*BASE[1:], f"synth.texts={texts}", f"synth.out_dir={tmp_path / 'out'}"])
    items, bad = read_lines(spec, build_graph(spec))
    assert [i.out.name for i in items] == ["ok.wav"]
    assert bad[0].startswith("line 2: id must be a file name") and "'nobody'" in bad[0]
    assert bad[1].startswith("line 3: id 'ok' repeats") and "text is empty" in bad[1]
    assert "klingon" in bad[1]
    assert bad[2] == 'line 4: no \'id\': each line names its file, e.g. {"id": "n1", "text": ...}'
