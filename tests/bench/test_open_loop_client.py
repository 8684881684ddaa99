"""The open-loop load generator (omniflow/bench/open_client.py) against a scripted server:
each arrival's outcome (ok, rejected, failed, aborted in the drain), the player's stalls on
the real stream, the warm-up arrivals left uncounted; and the `open_loop` object's
arithmetic on hand-made records."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading

import pytest
import uvicorn

from omniflow.bench.mode import Plan
from omniflow.bench.open_client import run
from omniflow.bench.open_loop import log_open_loop
from omniflow.bench.open_run import Request, Target
from omniflow.bench.open_stats import (
    peak_in_flight,
    percentiles,
    read_requests,
    summarize,
    write_requests,
)
from omniflow.bench.open_summary import open_loop_section

TENTH = 4800  # 0.1 s of 24 kHz s16le audio


class Script:
    """An ASGI app answering each speech request by its arrival index (its seed - 1000):
    0 ok (the warm-up), 1 a 429, 2 a 503, 3 audio with a 0.4 s gap (a stall), 4 ok,
    5 a 200 without audio, 6 never ends (aborted by the drain)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def __call__(self, scope, receive, send) -> None:
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw)
        self.bodies.append(body)
        i = body["seed"] - 1000

        async def start(status: int) -> None:
            await send({"type": "http.response.start", "status": status, "headers": []})

        async def chunk(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        if i in (1, 2):
            await start(429 if i == 1 else 503)
            await chunk(b'{"error": "busy"}', more=False)
            return
        await start(200)
        if i == 5:
            await chunk(b"", more=False)
            return
        if i == 6:  # no audio until the client gives up on it and disconnects
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await chunk(b"\x00" * TENTH)
        if i == 3:
            await asyncio.sleep(0.4)  # the scenario under test: the next audio comes late
        await chunk(b"\x00" * TENTH, more=False)


def serve(app) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(32)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.serial  # the stall's length is a time: alone on the CPU, as CI runs these
def test_each_arrival_gets_its_outcome_and_the_warm_up_is_not_counted():
    app = Script()
    server, thread, url = serve(app)
    # constant arrivals at 0, 0.1, ..., 0.6: index 0 in the warm-up, 1-6 measured
    plan = Plan(rps=10, arrivals="constant", duration_s=0.6, warmup_s=0.05, drain_s=1.0)
    try:
        reqs = asyncio.run(run(Target(url, ["one", "two"], "m", "v", max_frames=0), plan))
    finally:
        server.should_exit = True
        thread.join(10)
    assert [r.index for r in reqs] == list(range(7))
    assert [r.counted for r in reqs] == [False] + [True] * 6
    outcomes = [r.outcome for r in reqs]
    assert outcomes == ["ok", "rejected", "rejected", "ok", "ok", "failed", "failed"]
    assert "HTTP 429" in reqs[1].error and "HTTP 503" in reqs[2].error
    assert reqs[5].error.startswith("no audio")
    assert reqs[6].error.startswith("aborted: still running 1 s")
    # sent as a streaming client sends: raw PCM, the prompt's text at its natural length
    first = app.bodies[0]
    assert first["stream"] is True and first["response_format"] == "pcm"
    assert "max_new_tokens" not in first and "ignore_eos" not in first
    assert [b["input"] for b in app.bodies[:3]] == ["one", "two", "one"]  # in order, wrapping
    # arrivals on time: each sent at its arrival, 0.1 s apart
    for r in reqs:
        assert r.arrival_s == pytest.approx(r.index / 10)
        assert 0 <= r.sent_s - r.arrival_s < 1.0
    # the stream with a 0.4 s gap stalled once, ~0.3 s (0.4 s gap less the 0.1 s it had)
    late, prompt = reqs[3], reqs[4]
    assert late.stalls == 1 and 0.1 < late.stall_s == late.largest_stall_s < 1.5
    assert prompt.stalls == 0 and prompt.audio_bytes == 2 * TENTH
    assert 0 < prompt.first_audio_s <= prompt.e2e_s
    # the timeline: each chunk's time since sending and its bytes; the gap shows in it
    assert [n for _, n in late.chunks] == [TENTH, TENTH]
    assert late.chunks[0][0] == pytest.approx(late.first_audio_s, abs=1e-5)
    assert late.chunks[1][0] - late.chunks[0][0] > 0.39
    assert reqs[1].chunks == () and sum(n for _, n in prompt.chunks) == prompt.audio_bytes
    s = summarize(reqs, plan)
    assert (s["requests"], s["succeeded"], s["rejected"], s["failed"]) == (6, 2, 2, 2)
    assert s["underrun_requests"] == 1 and s["underrun_fraction"] == 0.5
    assert s["stall_ms"]["largest"] == pytest.approx(1e3 * late.stall_s)
    assert sum(e["count"] for e in s["errors"]) == 4


def test_the_out_file_keeps_every_record_and_its_timeline(tmp_path):
    plan = Plan(rps=2, arrivals="poisson", duration_s=1, warmup_s=0, drain_s=1)
    reqs = [record(0, chunks=((0.01, 960), (0.05, 1920))), record(1)]
    write_requests(tmp_path / "r.json", plan, reqs)
    assert read_requests(tmp_path / "r.json") == (plan, reqs)


def record(i: int, **kw) -> Request:
    base = dict(
        index=i,
        arrival_s=float(i),
        sent_s=float(i),
        ended_s=i + 1.0,
        counted=True,
        outcome="ok",
        error=None,
        first_audio_s=0.1,
        e2e_s=1.0,
        audio_bytes=48000,
        window_bytes=48000,
        stalls=0,
        stall_s=0.0,
        largest_stall_s=0.0,
    )
    return Request(**(base | kw))


def test_the_open_loop_object_adds_up_hand_made_requests(caplog, tmp_path):
    plan = Plan(rps=1.0, duration_s=4.0, warmup_s=1.0)
    reqs = [
        record(0, counted=False, ended_s=2.5, window_bytes=24000),  # warm-up, still playing
        record(1, first_audio_s=0.1),
        record(2, first_audio_s=0.2, stalls=2, stall_s=0.3, largest_stall_s=0.25),
        record(3, first_audio_s=0.3, stalls=1, stall_s=0.05, largest_stall_s=0.05),
        record(4, outcome="rejected", error="HTTP 429: busy", first_audio_s=None),
    ]
    s = summarize(reqs, plan)
    assert (s["requests"], s["succeeded"], s["rejected"], s["failed"]) == (4, 3, 1, 0)
    assert s["rejected_ms"]["p95"] == pytest.approx(1e3)  # the refused one's e2e: its answer
    with caplog.at_level(logging.WARNING, logger="omniflow.bench.open_loop"):
        log_open_loop(s)
    assert "1 rejected (answered in p50/p95 1000/1000 ms)" in caplog.text
    config = {"model": "m", "pipeline": "fused", "platform": "cpu", "dtype": "float32"}
    result = {"overrides": ["bench.rps=1"], "config": config, "open_loop": s}
    assert "| 1 | 4 | 3 | 1 (p95 1000 ms) | 0 |" in open_loop_section([result], tmp_path, "# S")
    assert s["first_audio_ms"]["p50"] == pytest.approx(200.0)
    assert s["first_audio_ms"]["p95"] == pytest.approx(290.0)  # linear between 200 and 300
    assert s["underrun_requests"] == 2 and s["underrun_fraction"] == pytest.approx(2 / 3)
    assert s["stall_ms"] == {"total": pytest.approx(350.0), "largest": pytest.approx(250.0)}
    # audio received inside the window, every request's (the warm-up one's too), per second
    assert s["delivered_audio_s_per_s"] == pytest.approx((24000 + 4 * 48000) / 48000 / 4.0)
    # from 1.0 on: request 0 (to 2.5) beside 1 (1-2) and 2 (2-3): two at once
    assert s["peak_in_flight"] == 2


def test_percentiles_and_peak_in_flight():
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}
    assert percentiles([5.0]) == {"p50": 5.0, "p95": 5.0, "p99": 5.0}
    p = percentiles([float(x) for x in range(101)])
    assert (p["p50"], p["p95"], p["p99"]) == pytest.approx((50.0, 95.0, 99.0))
    # open across the start counts from it; back to back is not overlap; before it, nothing
    spans = [(-2.0, -1.0), (-1.0, 0.5), (0.0, 1.0), (1.0, 2.0), (1.5, 3.0), (2.5, 9.0)]
    assert peak_in_flight(spans, 0.0, 10.0) == 2
    assert peak_in_flight([(0.0, 5.0), (1.0, 2.0), (1.5, 2.5)], 0.0, 5.0) == 3
    assert peak_in_flight([(0.0, 5.0), (6.0, 7.0), (6.5, 8.0)], 0.0, 5.0) == 1  # after `end`
