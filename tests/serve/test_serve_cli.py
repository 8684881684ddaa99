"""`python -m omniflow serve` as a process: starts, serves, warns about dummy weights, and
shuts down cleanly on SIGTERM and SIGINT, `omniflow stopped` its last line either way (issue
36 item 12: uvicorn re-raised SIGTERM once it had shut down, the handler's SystemExit skipped
the line, and a supervisor reading the log could not tell a clean stop from a crash)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from omniflow.serve.ready import READY
from tests.serve.test_keep_alive import closed_within, idle_connection


def start(*overrides: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "omniflow", "serve", "server.port=0", *overrides],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if READY in line:
            url = next(
                m.group(1) for ln in lines if (m := re.search(r"on (http://[\d.]+:\d+)", ln))
            )
            return proc, url, lines
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_embedded_default_serves_and_stops_cleanly(sig):
    proc, url, lines = start("server.keep_alive_timeout_s=0.5")
    try:
        # `omniflow serve` hands server.keep_alive_timeout_s to uvicorn: an idle kept-alive
        # connection is closed after 0.5 s (tests/serve/test_keep_alive.py: the default)
        sock = idle_connection(url)
        took = closed_within(sock, 10.0)
        sock.close()
        assert took is not None and took < 5.0, took
        dummy = [ln for ln in lines if "dummy weights" in ln.lower()]
        assert len(dummy) == 1 and "model.path=DIR" in dummy[0], dummy  # said once
        r = httpx.post(
            url + "/v1/audio/speech",
            timeout=60,
            json={
                "model": "qwen3-tts-tiny",
                "voice": "vivian",
                "input": "Hi.",
                "response_format": "pcm",
                "max_new_tokens": 3,
                "ignore_eos": True,
            },
        )
        assert r.status_code == 200 and len(r.content) == 3 * 1920 * 2
    finally:
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
    rest = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, rest
    assert "stopping engines" in rest and "Traceback" not in rest
    assert rest.rstrip().splitlines()[-1].endswith("omniflow stopped"), rest[-2000:]
