"""The load generators draw no progress bar where stderr is not a terminal (a file, a pipe,
pytest's capture): there a bar is carriage-return frames run into the log lines."""

from __future__ import annotations

import asyncio
import socket
import time

from omniflow.bench.client import Prompt, run
from omniflow.bench.mode import Plan
from omniflow.bench.open_run import Trace, drive


def test_the_open_loop_warm_up_bar_is_not_drawn_into_a_file(capsys):
    async def attempt(trace: Trace):
        trace.sent = time.perf_counter()
        return "failed", "nothing to send to"

    plan = Plan(rps=50.0, duration_s=0.1, warmup_s=0.1, arrivals="constant")
    records = asyncio.run(drive(plan, attempt))
    assert len(records) == 10
    assert "warm-up" not in capsys.readouterr().err


def test_the_closed_loop_requests_bar_is_not_drawn_into_a_file(capsys):
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    prompts = [Prompt("Hi.", 4)] * 3
    outcome = asyncio.run(run(url, prompts, concurrency=2, warmup=0, model="m", voice="vivian"))
    assert len(outcome.failures) == 3
    assert "requests" not in capsys.readouterr().err
