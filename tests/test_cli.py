"""The `omniflow` command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from omniflow import cli


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omniflow", *args], capture_output=True, text=True, timeout=120
    )


def test_config_fused_shows_stream_decode():
    r = run("config", "pipeline=qwen3_tts_fused", "platform=cpu")
    assert r.returncode == 0, r.stderr
    assert "stream_decode: true" in r.stdout
    graph = yaml.safe_load(r.stdout)
    assert graph["stages"]["talker"]["stream_decode"] is True


def test_config_two_stage_shows_atomic_chunks_on_code2wav():
    r = run("config", "pipeline=qwen3_tts", "platform=cpu")
    assert r.returncode == 0, r.stderr
    graph = yaml.safe_load(r.stdout)
    assert graph["stages"]["code2wav"]["atomic_chunks"] is True
    assert "atomic_chunks: true" in r.stdout


def test_config_refuses_window_k_1_with_exit_2():
    r = run("config", "pipeline=qwen3_tts", "platform=cpu", "pipeline.stages.talker.window_k=1")
    assert r.returncode == 2
    assert "window_k" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_config_window_k12_experiment():
    r = run("config", "pipeline=qwen3_tts_fused", "platform=cpu", "experiment=window_k12")
    assert r.returncode == 0, r.stderr
    assert "window_k: 12" in r.stdout


def test_config_ref_context_frames_refused_until_voice_clone():
    r = run(
        "config",
        "pipeline=qwen3_tts_fused",
        "platform=cpu",
        "pipeline.stages.talker.ref_context_frames=0",
    )
    assert r.returncode == 2
    assert "pipeline.stages.talker.ref_context_frames" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_command_exits_2():
    r = run("frobnicate")
    assert r.returncode == 2
    assert "usage" in r.stderr


def test_no_command_is_a_usage_error():
    r = run()
    assert r.returncode == 2 and "usage: omniflow COMMAND" in r.stderr and not r.stdout


def test_serve_applies_server_log_level_to_omniflows_loggers(monkeypatch):
    """`server.log_level` sets omniflow's loggers too, before the server starts."""
    import logging

    import omniflow.serve.run
    from omniflow import cli

    seen = {}

    def fake_run_serve(overrides, config_dir):
        seen["level"] = logging.getLogger("omniflow.serve").getEffectiveLevel()
        return 0

    monkeypatch.setattr(omniflow.serve.run, "run_serve", fake_run_serve)
    root, ours = logging.getLogger(), logging.getLogger("omniflow")
    monkeypatch.setattr(root, "level", root.level)  # restored after the test
    monkeypatch.setattr(ours, "level", ours.level)
    argv = ["serve", "platform=cpu", "server.port=0", "server.log_level=warning"]
    assert cli.main(argv) == 0
    assert seen["level"] == logging.WARNING


def test_the_console_script_is_installed_and_runs():
    import sysconfig
    from pathlib import Path

    script = Path(sysconfig.get_path("scripts")) / "omniflow"
    assert script.is_file(), "pip install -e . installs the `omniflow` console script"
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: omniflow COMMAND" in r.stdout


def test_sweep_help_names_the_plot_of_either_kind_of_sweep(capsys):
    """A closed-loop sweep plots rtf.png, an open-loop one open_loop.png (both written:
    tests/bench/test_bench_sweep.py, tests/bench/test_open_loop_job.py)."""
    assert cli.main(["sweep", "--help"]) == 0
    text = capsys.readouterr().out
    assert "DIR/rtf.png" in text and "DIR/open_loop.png" in text
    assert cli.main(["bench", "--help"]) == 0
    assert "DIR/open_loop.png" in capsys.readouterr().out


def test_synth_usage_shows_text_and_out_are_optional(capsys):
    """Both have defaults (a bare `omniflow synth` speaks "Hello there." into out.wav): the
    usage line said they were required."""
    assert cli.main(["synth", "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith('usage: omniflow synth [text="..."] [out=FILE]')
    assert "text and out default to the values below" in text and "  out=out.wav" in text


def test_a_commands_help_offers_only_what_it_reads(capsys):
    """synth reads no deploy group and one server key: its help lists that key and not
    deploy=local|ray (which it refuses); serve's lists deploy."""
    assert cli.main(["synth", "--help"]) == 0
    text = capsys.readouterr().out
    assert "deploy=" not in text and "  server.max_input_chars=4096" in text
    assert "server.port" not in text
    assert cli.main(["serve", "--help"]) == 0
    assert "deploy=local|ray" in capsys.readouterr().out
