"""A newcomer's mistakes: each is one line on stderr and exit status 2, found before any model
is built (stderr would otherwise carry the dummy-weights warning too), never a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

ONE_LINE_ERRORS = 2


def omniflow(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omniflow", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == ONE_LINE_ERRORS, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert r.stdout == ""
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_serve_on_cuda_without_cuda():
    line = one_line_error(omniflow("serve", "platform=cuda"), "platform.name", "platform=cpu")
    assert "CUDA" in line


def test_serve_on_a_port_in_use_fails_before_building_the_model():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = omniflow("serve", "platform=cpu", f"server.port={port}")
    one_line_error(r, "server.port", f"127.0.0.1:{port} is already in use")


def test_serve_on_an_address_not_of_this_machine_names_the_host():
    r = omniflow("serve", "platform=cpu", "server.host=192.0.2.1")  # TEST-NET-1
    one_line_error(r, "server.host", "cannot bind 192.0.2.1:8000", "an address of this machine")


@pytest.mark.parametrize("command", ["config", "serve", "synth"])
def test_a_missing_checkpoint_directory(command, tmp_path):
    r = omniflow(command, "platform=cpu", "model=qwen3_tts_1_7b", "model.path=/nonexistent")
    one_line_error(r, "model.path", "/nonexistent does not exist")


def test_synth_into_a_missing_directory_fails_before_generating(tmp_path):
    r = omniflow("synth", "platform=cpu", "out=/no/such/dir/x.wav")
    one_line_error(r, "synth.out", "/no/such/dir")


def test_synth_into_a_directory_names_it(tmp_path):
    r = omniflow("synth", "platform=cpu", f"out={tmp_path}")
    one_line_error(r, "synth.out", "is a directory")
    assert list(tmp_path.iterdir()) == []


def test_synth_refuses_a_format_it_cannot_write(tmp_path):
    r = omniflow("synth", "platform=cpu", f"out={tmp_path / 'x.aac'}")
    one_line_error(r, "synth.out", ".aac", ".flac")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (("config", "server.prot=1"), "did you mean server.port?"),
        (("config", "+pipeline.stages.talker.windowk=4"), "pipeline.stages.talker.window_k?"),
        (("config", "pipeline=qwen3_tts_fusd"), "did you mean pipeline=qwen3_tts_fused?"),
        (("synth", "txt=Hello"), "did you mean text?"),
        (("bench", "bench.concurency=2"), "did you mean bench.concurrency?"),
    ],
)
def test_a_typo_suggests_the_closest_key(args, suggestion):
    one_line_error(omniflow(*args), suggestion)


@pytest.mark.parametrize(
    ("command", "keys"),
    [
        ("serve", ["server.port=8000", "server.log_level=info", "Bind port", "deploy.replicas=1"]),
        ("synth", ["text=Hello there.", "out=out.wav", "ignore_eos=false", ".flac"]),
        ("bench", ["bench.concurrency=1", "bench.num_prompts=16", "--cfg job"]),
    ],
)
def test_command_help_lists_its_keys(command, keys):
    r = omniflow(command, "--help")
    assert r.returncode == 0, r.stderr
    for key in keys:
        assert key in r.stdout
    assert f"usage: omniflow {command}" in r.stdout


def test_help_names_every_shipped_preset_and_config_help_says_how_keys_are_set():
    from omniflow.config.compose import CONF_DIR

    serve = omniflow("serve", "--help").stdout
    listed = dict(
        line.strip().split("=", 1)
        for line in serve.splitlines()
        if line.startswith("  ") and "=" in line and "|" in line
    )
    for group in ("model", "platform", "pipeline", "deploy", "experiment"):
        presets = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
        assert set(listed[group].split("|")) == presets, group
    config = omniflow("config", "--help")
    assert config.returncode == 0 and "usage: omniflow config" in config.stdout
    assert "any other as printed" in config.stdout and "model=" in config.stdout


def test_help_shows_the_values_of_the_composed_config():
    r = omniflow("serve", "server.port=9123", "--help")
    assert r.returncode == 0 and "server.port=9123" in r.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; kill, timeout
def test_ctrl_c_during_synth_is_one_line_and_writes_nothing(tmp_path, sig):
    out = tmp_path / "long.wav"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "omniflow",
            "synth",
            "platform=cpu",
            f"out={out}",
            "max_new_tokens=4000",
            "ignore_eos=true",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen = b""
    try:
        # Generation has started once the bar has counted a frame ("synth:  0%" is drawn
        # before the first one).
        while b"1/4000" not in seen and b"2/4000" not in seen:
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, seen.decode(errors="replace")
            seen += chunk
        proc.send_signal(sig)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = (seen + rest).decode()
    assert proc.returncode == ONE_LINE_ERRORS, stderr
    assert "Traceback" not in stderr and stdout == b""
    last = stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("omniflow synth: interrupted after ") and "nothing written" in last
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file left behind


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: str(d / "missing.wav"), "does not exist"),
        (
            lambda d: (d / "notes.wav").write_text("no audio here " * 50) and str(d / "notes.wav"),
            "is not audio",
        ),
    ],
)
def test_synth_refuses_a_missing_or_non_audio_reference(tmp_path, make, needle):
    ref = make(tmp_path)
    r = omniflow(
        "synth",
        "model=qwen3_tts_tiny_base",
        "platform=cpu",
        f"ref_audio={ref}",
        "ref_text=x",
        f"out={tmp_path / 'o.wav'}",
    )
    one_line_error(r, "synth.ref_audio", needle)
    assert not (tmp_path / "o.wav").exists()


def test_synth_reports_a_missing_transcript_and_a_missing_reference_at_once(tmp_path):
    args = ["synth", "model=qwen3_tts_tiny_base", "platform=cpu", "text=Hi"]
    r = omniflow(*args, f"ref_audio={tmp_path / 'nofile.wav'}", f"out={tmp_path / 'o.wav'}")
    assert r.returncode == ONE_LINE_ERRORS and "Traceback" not in r.stderr
    assert "2 configuration errors" in r.stderr, r.stderr
    assert "synth.ref_text:" in r.stderr and "nofile.wav' does not exist" in r.stderr


def test_synth_checks_run_before_torch_is_loaded():
    """A mistake is reported before the 1.5 s it takes to import torch (the model's)."""
    code = "import sys, omniflow.synth; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
