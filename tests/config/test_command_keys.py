"""A command's section (server, synth, bench, deploy) set for a command that does not read it
is refused, naming the commands where it acts (`config/command_keys.py`); `omniflow config`
prints a section an override names."""

from __future__ import annotations

import logging

import pytest
import yaml

from omniflow import cli
from omniflow.config.command_keys import acts

REFUSED = [
    (
        ["synth", "server.port=9"],
        "server.port",
        "`omniflow serve`; synth reads server.max_input_chars",
    ),
    (["synth", "bench.concurrency=3"], "bench.concurrency", "it acts in `omniflow bench`"),
    (["synth", "deploy=ray"], "deploy", "`omniflow serve` and `omniflow bench`"),
    (["synth", "+server.port=9"], "server.port", "does not act in `omniflow synth`"),
    (["serve", "synth.text=Hi"], "synth.text", "it acts in `omniflow synth`"),
    (["serve", "bench.rps=2"], "bench.rps", "it acts in `omniflow bench`"),
    (["bench", "server.port=9"], "server.port", "a free loopback port of its own"),
    (["bench", "server.host=0.0.0.0"], "server.host", "a free loopback port of its own"),
    (["bench", "synth.voice=ryan"], "synth.voice", "it acts in `omniflow synth`"),
]


@pytest.mark.parametrize(("argv", "key", "words"), REFUSED)
def test_a_key_another_command_reads_is_refused_in_one_line(capsys, monkeypatch, argv, key, words):
    """Before the command runs (here it would do nothing and succeed)."""
    monkeypatch.setitem(cli.COMMANDS, argv[0], lambda args: 0)
    assert cli.main([*argv, "platform=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"invalid configuration: {key}: does not act in `omniflow {argv[0]}`" in err
    assert words in err, err


def test_a_typo_in_such_a_section_still_gets_the_nearest_key(capsys):
    assert cli.main(["synth", "server.prot=9"]) == 2
    assert "did you mean server.port?" in capsys.readouterr().err


def test_what_each_command_reads():
    assert (
        acts("serve", "server.port")
        and acts("serve", "deploy")
        and acts("serve", "deploy.replicas")
    )
    assert acts("synth", "synth.text") and acts("synth", "server.max_input_chars")
    assert not acts("synth", "server.max_concurrent_requests")
    assert acts("bench", "server.max_first_audio_wait_s") and acts("bench", "server.log_level")
    assert not acts("bench", "server.port") and not acts("serve", "synth")
    assert all(acts("config", k) for k in ("server.port", "synth.text", "bench.rps", "deploy"))


def test_synth_acts_on_the_servers_input_limit(capsys, tmp_path):
    out = tmp_path / "x.wav"
    argv = ["synth", "platform=cpu", "server.max_input_chars=3", "text=Hello", f"out={out}"]
    assert cli.main(argv) == 2
    assert "text is 5 characters; the limit is 3" in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture
def omniflow_level():
    logger = logging.getLogger("omniflow")
    before, root = logger.level, logging.getLogger().level
    yield logger
    logger.setLevel(before)
    logging.getLogger().setLevel(root)


def test_bench_sets_its_loggers_to_server_log_level(capsys, omniflow_level):
    """The bench serves in its own process: the server's log level is this process's.
    (`bench.duration_s` without `bench.rps` is refused once the job starts, after it.)"""
    argv = ["bench", "platform=cpu", "server.log_level=error", "bench.duration_s=5"]
    assert cli.main(argv) == 2
    assert "bench.duration_s" in capsys.readouterr().err
    assert omniflow_level.getEffectiveLevel() == logging.ERROR


def test_config_prints_a_command_section_an_override_names(capsys):
    assert cli.main(["config", "server.port=9001", "synth.text=Hi"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["server"]["port"] == 9001 and printed["synth"]["text"] == "Hi"
    assert "bench" not in printed and "pipeline" in printed
    assert cli.main(["config"]) == 0
    assert not {"server", "synth", "bench"} & set(yaml.safe_load(capsys.readouterr().out))


def test_a_whole_section_given_as_a_mapping_is_checked_key_by_key(capsys, monkeypatch):
    """`server={port:5}` sets server.port: refused in bench as that key is; synth's one
    server key passes the same way."""
    monkeypatch.setitem(cli.COMMANDS, "bench", lambda args: 0)
    assert cli.main(["bench", "server={port:5}"]) == 2
    assert "server.port: does not act in `omniflow bench`" in capsys.readouterr().err
    monkeypatch.setitem(cli.COMMANDS, "synth", lambda args: 0)
    assert cli.main(["synth", "server={max_input_chars:5}"]) == 0
