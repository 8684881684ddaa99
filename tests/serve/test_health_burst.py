"""`/health` keeps answering during a burst of 1,000 speech requests (docs/reliability.md).

The server is the embedded default in this process; the burst and the health probe run in
two other processes (`benchmarks/burst.py`), so that their CPU work is not the server's and
the probe does not wait for the burst's GIL. The burst is 1,000 connections at once; this
test admits 32 at a time (the rest get a 429, which costs the server as much to parse), so
it finishes in seconds.

Every probe sent while the burst is in flight must answer 200 within 100 ms: the worst one,
not the median. Without the server's intake pacing (`serve.intake.Intake`), the one or two
probes that arrived while the event loop took in the burst waited 0.3-0.9 s behind it on
this project's 2-core machine, and one that met a full garbage collection of the test
process's heap ~150-220 ms (`serve.run.freeze_heap`); with both, the worst is 20-80 ms, with
other test runs loading the machine.

Both tests time the server against a spare CPU, so they carry the `serial` marker: CI runs them
in a session of their own after the parallel (`-n 2`) one (README.md, "Tests"). Beside another
pytest process running model tests, a probe assertion failed in 1 of 37 runs on that machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import LiveServer

pytestmark = pytest.mark.serial

REPO = Path(__file__).resolve().parents[2]

ARGS = ["--frames", "1", "--idle", "0"]


def test_health_answers_during_a_burst_of_a_thousand_requests():
    # the in-flight cap's 429 is the subject, not admission by deadline: 32 streams on this
    # CPU step slower than their audio, and it would refuse some (503) instead
    with LiveServer(
        "server.max_concurrent_requests=32", "server.max_first_audio_wait_s=null"
    ) as server:
        run = subprocess.run(
            [sys.executable, "-m", "benchmarks.burst", "--url", server.url, *ARGS],
            cwd=REPO,  # where `benchmarks` is importable
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        result = json.loads(run.stdout)
        server.wait_idle()
    statuses = result["statuses"]
    assert sum(statuses.values()) == 1000 and set(statuses) <= {"200", "429"}, statuses
    assert statuses["200"] >= 32 and statuses["429"] > 0
    health = result["health_during"]
    assert health["probes"] >= 5 and health["statuses"] == {"200": health["probes"]}
    assert health["max_ms"] < 100, health


def test_responses_on_a_kept_alive_connection_do_not_wait_for_a_delayed_ack():
    """The server's sockets carry TCP_NODELAY (`serve.run.listening_socket`). Without it, a
    response written as headers then body waits for the client's delayed ACK on every reused
    connection: ~40 ms per /health on Linux (and per streamed chunk), idle or not."""
    with LiveServer() as server, httpx.Client() as client:
        client.get(server.url + "/health")  # open the connection
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            assert client.get(server.url + "/health").status_code == 200
            times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.02, times
