"""`omniflow bench bench.rps=R`: the open-loop job end to end on the tiny model (a sweep over
two rates: result.json's `open_loop` object per job, the summary table and the plot), a
single run, and the keys refused in the wrong loop."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from omniflow import cli
from omniflow.bench.arrivals import arrival_times
from omniflow.bench.mode import check_mode
from omniflow.config.compose import compose
from omniflow.errors import ConfigError, ConfigErrors

FIELDS = {
    "rps",
    "requests",
    "succeeded",
    "rejected",
    "rejected_ms",
    "first_audio_ms",
    "underrun_requests",
    "underrun_fraction",
    "stall_ms",
    "peak_in_flight",
    "delivered_audio_s_per_s",
    "device",
    "commit",
    "date",
    "command",
}


def omniflow(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omniflow", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


SHORT = [  # 28 to 36 frames each at the dummy weights' speaking rate (the shipped set: 40-110)
    "A short line, said at its own pace.",
    "Another one, a little longer than that.",
    "Open loop: requests arrive as they will.",
    "Seeded arrivals, two rates, one pattern.",
]


def test_an_open_loop_sweep_writes_each_rates_result_a_table_and_a_plot(tmp_path):
    out = tmp_path / "sweep"
    prompts = tmp_path / "short.jsonl"
    prompts.write_text("".join(json.dumps({"text": t, "seconds": 2.5}) + "\n" for t in SHORT))
    r = omniflow(
        "bench",
        "-m",
        "platform=cpu",
        f"bench.prompts={prompts}",
        "bench.warmup=0",
        "bench.warmup_s=0.25",
        "bench.duration_s=1",
        "bench.seed=123",  # at each rate: one arrival in the warm-up, two measured
        "bench.rps=1,2",
        # queue, not refuse: on a busy 2-core machine 2 req/s can outrun the tiny model and
        # admission would turn both measured requests away (the sweep is the subject here)
        "server.max_first_audio_wait_s=null",
        f"bench.out_dir={out}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    results = [json.loads((out / str(i) / "result.json").read_text()) for i in range(2)]
    for rate, res in zip((1, 2), results, strict=True):
        o = res["open_loop"]
        assert set(o) >= FIELDS, FIELDS - set(o)
        assert o["rps"] == rate and res["config"]["mode"] == "open loop"
        # the seeded arrivals of the measured window, every one answered with its audio
        due = arrival_times(rate, 1.25, "poisson", 123)
        assert o["requests"] == sum(t >= 0.25 for t in due) == 2 and due[0] < 0.25
        assert o["succeeded"] == o["requests"] and o["rejected"] == o["failed"] == 0
        first = o["first_audio_ms"]
        assert 0 < first["p50"] <= first["p95"] <= first["p99"] < 10_000
        assert 0 <= o["underrun_requests"] <= o["succeeded"]
        assert o["underrun_fraction"] == o["underrun_requests"] / o["succeeded"]
        assert 0 <= o["stall_ms"]["largest"] <= o["stall_ms"]["total"]
        assert (o["underrun_requests"] == 0) == (o["stall_ms"]["total"] == 0)
        assert 1 <= o["peak_in_flight"] <= o["requests"] + 2  # + warm-up arrivals
        assert o["delivered_audio_s_per_s"] > 0
        # natural lengths: each text its own (the dummy model's speaking-rate estimate)
        frames = o["frames_per_request"]
        assert frames["min"] > 20 and frames["max"] < 200
        assert o["command"].startswith("python -m omniflow bench ") and o["device"]
        assert o["command"] == res["command"] and o["commit"] == res["commit"]
        assert f"bench.rps={rate}" in o["command"]
    assert [res["config"]["pipeline_reused"] for res in results] == [False, True]
    summary = (out / "summary.md").read_text()
    assert "open loop: poisson arrivals (seed 123), 1 s measured after 0.25 s" in summary
    assert "| req/s | requests | succeeded | rejected | failed |" in summary
    assert "\n| 1 | " in summary and "\n| 2 | " in summary
    assert "![p95 first audio and stalled fraction against req/s](open_loop.png)" in summary
    assert (out / "open_loop.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "rtf.png").exists()
    log = (out / "1" / "bench.log").read_text()
    assert "open loop: 2 req/s (poisson arrivals, seed 123) for 1 s after 0.25 s" in log
    assert "open loop 2 req/s: " in log and "first audio p50/p95/p99" in log
    assert "open loop: measured" not in r.stderr  # no bar off a terminal: log lines only
    again = omniflow("sweep", "summarize", str(out), cwd=tmp_path)
    assert again.returncode == 0 and "| req/s |" in again.stdout


def test_a_single_open_loop_run_prints_its_open_loop_object(tmp_path, capsys, monkeypatch):
    """Through `omniflow bench`'s entry point in this process, from an empty directory (the
    command line as a child: the sweep above)."""
    monkeypatch.chdir(tmp_path)
    r = cli.main(
        [
            "bench",
            "platform=cpu",
            "bench.warmup=1",
            "bench.rps=3",
            "bench.arrivals=constant",
            "bench.warmup_s=0",
            "bench.duration_s=1",
            "bench.max_frames=6",  # asked for: each request at most 6 frames
        ]
    )
    out = capsys.readouterr()
    assert r == 0, out.err
    o = json.loads(out.out)
    assert o["rps"] == 3 and o["arrivals"] == "constant"
    assert o["requests"] == o["succeeded"] == 3  # at 0, 1/3, 2/3 s
    assert o["frames_per_request"]["max"] <= 6
    assert list(tmp_path.iterdir()) == []  # no bench.out_dir: nothing written


@pytest.mark.parametrize(
    ("args", "key", "words"),
    [
        (["bench.duration_s=5"], "bench.duration_s", "needs bench.rps"),
        (["bench.arrivals=constant"], "bench.arrivals", "needs bench.rps"),
        (["bench.warmup_s=1"], "bench.warmup_s", "needs bench.rps"),
        (["bench.seed=3"], "bench.seed", "needs bench.rps"),
        (["bench.drain_s=3"], "bench.drain_s", "needs bench.rps"),
        (["bench.rps=5", "bench.concurrency=4"], "bench.concurrency", "closed-loop key"),
        (["bench.rps=5", "bench.rounds=2"], "bench.rounds", "closed-loop key"),
        (["bench.rps=5", "bench.num_prompts=4"], "bench.num_prompts", "closed-loop key"),
        (["bench.rps=5", "bench.prompts_per_lane=4"], "bench.prompts_per_lane", "closed-loop"),
    ],
)
def test_a_key_the_jobs_loop_would_not_read_is_refused_by_name(args, key, words):
    with pytest.raises(ConfigError) as info:
        check_mode(compose(["platform=cpu", *args]).bench)
    assert info.value.key == key and words in info.value.reason


def test_refusals_come_before_anything_runs(tmp_path, capsys, monkeypatch):
    r = omniflow("bench", "platform=cpu", "bench.duration_s=5", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert "bench.duration_s: an open-loop key: it needs bench.rps=R" in r.stderr
    assert "Traceback" not in r.stderr
    # a sweep is checked job by job before the first one runs (the command's entry point in
    # this process, from the same directory: nothing runs, so a child would only import)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "-m", "platform=cpu", "bench.rps=1,2", "bench.rounds=2"]) == 2
    assert "bench.rounds: a closed-loop key" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # the bounds of the keys themselves
    for bad, key in (("bench.rps=0", "bench.rps"), ("bench.arrivals=uniform", "bench.arrivals")):
        with pytest.raises(ConfigError) as info:
            compose(["bench.rps=1", bad])
        assert info.value.key == key
    with pytest.raises(ConfigErrors):  # several wrong at once: all named
        check_mode(compose(["bench.duration_s=5", "bench.seed=1"]).bench)


def test_the_open_loop_keys_are_listed_and_can_be_set_as_printed():
    from omniflow.cli_help import command_help

    spec = compose(["bench.rps=2.5", "bench.arrivals=constant", "bench.duration_s=30"])
    text = command_help("bench", spec)
    printed = [line.strip() for line in text.splitlines() if line.startswith("  bench.")]
    for line in ("bench.rps=2.5", "bench.arrivals=constant", "bench.duration_s=30.0"):
        assert line in printed
    assert "bench.warmup_s=null" in printed and "bench.seed=null" in printed
    again = compose(printed).bench
    assert again == spec.bench  # every printed line is a valid override giving the same value


def test_refused_requests_name_the_limit_and_its_key(tmp_path, caplog, monkeypatch):
    """As the closed loop does: a 503 names server.max_first_audio_wait_s and how to queue
    instead; the error is the server's text, not a Python bytes literal."""
    from omniflow.bench import open_loop
    from omniflow.bench.outcome import http_error
    from tests.bench.test_open_loop_client import record

    refusal = http_error(503, b'{"error":{"message":"the server is at capacity"}}')
    made = [record(0), record(1, outcome="rejected", error=refusal, first_audio_s=None)]
    monkeypatch.setattr(open_loop, "open_loop_in_child", lambda *a, **k: made)
    argv = ["bench", "platform=cpu", "bench.warmup=0", "bench.rps=2", "bench.duration_s=2"]
    out = tmp_path / "new" / "job"  # made, parents and all, and named in the log
    argv += [f"bench.out_dir={out}", "bench.warmup_s=0", "server.max_first_audio_wait_s=0.25"]
    with caplog.at_level("INFO", logger="omniflow"):
        assert cli.main(argv) == 0
    assert f"wrote {out / 'result.json'}" in caplog.text and (out / "result.json").is_file()
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "server.max_first_audio_wait_s=0.25" in warned and "=null" in warned, warned
    assert '(first: HTTP 503: {"error"' in warned and "b'" not in warned, warned


def test_an_error_line_is_text_and_names_its_status():
    from omniflow.bench.outcome import http_error, http_status

    line = http_error(429, "trop de requêtes".encode() + b"\xff" + b"x" * 300)
    assert line.startswith("HTTP 429: trop de requêtes\ufffd") and len(line) < 220
    assert http_status(line) == 429
    assert http_status("ConnectError: refused") is None and http_status(None) is None
