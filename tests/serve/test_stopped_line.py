"""`omniflow stopped` is the last line of every shutdown (issue 36 item 12): SIGTERM too,
not only SIGINT. Before, uvicorn re-raised SIGTERM once it had shut down, the handler's
SystemExit skipped the line, and a supervisor reading the log could not tell a clean stop
from a crash."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.serve.test_shutdown import serve


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_server_logs_that_it_stopped(sig):
    proc, _ = serve()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, err
    assert err.rstrip().splitlines()[-1].endswith("omniflow stopped"), err[-2000:]
