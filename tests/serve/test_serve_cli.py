"""`python -m omniflow serve` as a process: starts, serves, warns about dummy weights, and
shuts down cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import pytest


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
        if "Application startup complete" in line:
            url = next(
                m.group(1) for ln in lines if (m := re.search(r"on (http://[\d.]+:\d+)", ln))
            )
            return proc, url, lines
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_embedded_default_serves_and_stops_cleanly(sig):
    proc, url, lines = start()
    try:
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
