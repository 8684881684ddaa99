"""`omniflow bench bench.transport=websocket`: the keys' rules, and the WebSocket open-loop
load generator (omniflow/bench/ws_client.py, run as the job runs it: a child process) against
a real server (tiny model, CPU) in incremental mode: each session's first audio, e2e and
last audio after input.done; sessions refused at the server's cap; a refused config."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import ExitStack

import pytest
from websockets.sync.client import connect

from omniflow.bench import ws_client
from omniflow.bench.arrivals import arrival_times
from omniflow.bench.mode import Plan, check_mode, open_plan
from omniflow.bench.open_loop import log_open_loop, open_loop_in_child
from omniflow.bench.open_run import Target
from omniflow.bench.open_stats import summarize
from omniflow.bench.open_summary import open_loop_section
from omniflow.config.compose import compose
from omniflow.errors import ConfigError
from tests.serve.conftest import LiveServer

CAP = 6
"""The server's in-flight cap: above the sessions the run keeps open at once."""
TEXTS = [
    "Speech while the text is written.",
    "One word at a time, as written.",
    "The last short session ends here.",
]


@pytest.mark.parametrize(
    ("args", "key", "words"),
    [
        (["bench.transport=websocket"], "bench.transport", "open loop only"),
        (["bench.transport=websocket", "bench.concurrency=2"], "bench.transport", "bench.rps"),
        (["bench.word_interval_ms=20"], "bench.word_interval_ms", "bench.transport=websocket"),
        (["bench.rps=1", "bench.word_interval_ms=20"], "bench.word_interval_ms", "sends each"),
    ],
)
def test_a_websocket_key_outside_its_mode_is_refused_by_name(args, key, words):
    with pytest.raises(ConfigError) as info:
        check_mode(compose(["platform=cpu", *args]).bench)
    assert info.value.key == key and words in info.value.reason


def test_the_websocket_keys_make_the_plan_and_are_listed_as_settable():
    from omniflow.cli_help import command_help

    bench = compose(["bench.rps=2", "bench.transport=websocket", "bench.word_interval_ms=25"]).bench
    check_mode(bench)  # accepted together
    plan = open_plan(bench)
    assert (plan.transport, plan.word_interval_ms) == ("websocket", 25.0)
    http = open_plan(compose(["bench.rps=2"]).bench)
    assert (http.transport, http.word_interval_ms) == ("http", None)
    with pytest.raises(ConfigError) as info:
        compose(["bench.rps=1", "bench.transport=grpc"])
    assert info.value.key == "bench.transport"
    spec = compose(["bench.rps=2", "bench.transport=websocket"])
    printed = [
        line.strip()
        for line in command_help("bench", spec).splitlines()
        if line.startswith("  bench.")
    ]
    assert "bench.transport=websocket" in printed and "bench.word_interval_ms=10.0" in printed
    assert compose(printed).bench == spec.bench  # settable as printed


def test_ws_words_keep_their_spaces_and_the_config_is_incremental_pcm():
    assert ws_client.words(" Hello  there,\nworld.") == ["Hello  ", "there,\n", "world."]
    config = ws_client.session_config(3, "m", "vivian", max_frames=0)
    assert config == {
        "type": "session.config",
        "incremental": True,
        "stream_audio": True,
        "model": "m",
        "voice": "vivian",
        "response_format": "pcm",
        "seed": 1003,
    }
    assert ws_client.ws_url("http://127.0.0.1:80") == "ws://127.0.0.1:80/v1/audio/speech/stream"


@pytest.fixture(scope="module")
def live():
    with LiveServer(f"server.max_concurrent_requests={CAP}") as server:
        yield server


def test_sessions_at_a_fixed_word_cadence_record_first_audio_and_after_done(live, caplog, tmp_path):
    # constant arrivals at 0, 0.05, 0.1 s: the first in the warm-up, two measured
    plan = Plan(
        rps=20,
        arrivals="constant",
        duration_s=0.08,
        warmup_s=0.05,
        drain_s=60,
        transport="websocket",
        word_interval_ms=20,  # not the generator's default: the child is told it
    )
    model = live.pipeline.info().model
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    reqs = open_loop_in_child(plan, live.url, str(prompts), model, "vivian", 0)
    assert [r.index for r in reqs] == [0, 1, 2]
    assert [r.counted for r in reqs] == [False, True, True]
    assert [(r.outcome, r.error) for r in reqs] == [("ok", None)] * 3
    for r in reqs:
        words = len(ws_client.words(TEXTS[r.index]))
        assert words > 5
        assert 0 < r.first_audio_s < r.e2e_s  # from the first word to the first audio
        # input.done went after the last word, (words - 1) intervals after the first; the
        # last audio came after it, and the session ended after that
        assert r.after_done_s is not None and r.after_done_s > 0
        assert r.e2e_s > (words - 1) * 0.020 + r.after_done_s - 0.005
        assert r.audio_bytes == sum(n for _, n in r.chunks) and r.audio_bytes % 2 == 0
        assert r.sent_s >= r.arrival_s
    assert arrival_times(20, 0.13, "constant") == [r.arrival_s for r in reqs]
    s = summarize(reqs, plan)
    assert (s["transport"], s["word_interval_ms"]) == ("websocket", 20)
    assert (s["requests"], s["succeeded"], s["rejected"], s["failed"]) == (2, 2, 0, 0)
    assert "rejected_ms" not in s  # a refusal can come before the first word: not timed
    after = s["last_audio_after_done_ms"]
    assert 0 < after["p50"] <= after["p95"] <= after["p99"]
    assert after["p99"] <= 1e3 * max(r.after_done_s for r in reqs if r.counted) + 1e-6
    with caplog.at_level(logging.INFO, logger="omniflow.bench.open_loop"):
        log_open_loop(s)
    assert "over WebSocket, a word every 20 ms: last audio after input.done" in caplog.text
    result = {
        "overrides": ["bench.transport=websocket", "bench.rps=20"],
        "config": {"model": model, "pipeline": "fused", "platform": "cpu", "dtype": "float32"},
        "open_loop": s,
    }
    table = open_loop_section([result], tmp_path, "# Sweep")
    assert "open loop over WebSocket (incremental, a word every 20 ms)" in table
    assert "| last audio after input.done ms p50 / p95 / p99 |" in table
    assert f" {after['p50']:.0f} / {after['p95']:.0f} / {after['p99']:.0f} |" in table


def test_sessions_past_the_cap_are_rejected_and_a_refused_config_fails(live):
    plan = Plan(20, "constant", 0.1, 0, drain_s=30, transport="websocket", word_interval_ms=10)
    model = live.pipeline.info().model
    with ExitStack() as held:
        for _ in range(CAP):  # each open session holds a place, speaking or not
            ws = held.enter_context(connect(ws_client.ws_url(live.url)))
            ws.send(json.dumps({"type": "nonsense"}))  # answered: the session is running
            assert json.loads(ws.recv(timeout=30))["type"] == "error"
        target = Target(live.url, ["Too many now."], model, "vivian")
        reqs = asyncio.run(ws_client.run(target, plan))
    assert [r.outcome for r in reqs] == ["rejected", "rejected"], reqs
    assert all(r.error.startswith("error event 429: ") for r in reqs)
    assert all(r.first_audio_s is None and r.after_done_s is None for r in reqs)
    reqs = asyncio.run(ws_client.run(Target(live.url, ["Nobody speaks."], model, "nobody"), plan))
    assert [r.outcome for r in reqs] == ["failed", "failed"]
    assert all("error event 400: unknown voice 'nobody'" in r.error for r in reqs)
    s = summarize(reqs, plan)
    assert s["failed"] == 2 and s["last_audio_after_done_ms"]["p50"] is None
