"""What the connection layer answers (issue 36 item 17): a request head h11 refuses gets the
API's JSON error with h11's status, and a client that leaves during its upload costs one log
line, not a traceback.

Before, uvicorn answered every refused head with a plain-text 400 ("Invalid HTTP request
received.") and let a 70 KB header through when it arrived in one read; an aborted upload
logged a 62-line "Exception in ASGI application" traceback each time."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline
from tests.serve.test_idle_connections import closed_within


@pytest.fixture(scope="module")
def server():
    with ServerThread(FakePipeline(), compose(["platform=cpu"]).server) as running:
        yield running


def answer_to(server: ServerThread, *pieces: bytes) -> bytes:
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        for piece in pieces:
            sock.sendall(piece)
        answer = closed_within(sock, 5.0)
    finally:
        sock.close()
    assert answer is not None, "no answer"
    return answer


HUGE = b"X-Big: " + b"a" * 70_000 + b"\r\n"


@pytest.mark.parametrize(
    ("pieces", "status", "says"),
    [
        ([b"GET /health HTTP/1.1\r\n\r\n"], 400, "Host"),
        ([b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"], 400, ""),
        ([b"GET /health HTTP/1.1\r\nHost: x\r\n" + HUGE + b"\r\n"], 431, "max_header_bytes"),
        ([b"GET /health HTTP/1.1\r\nHost: x\r\n", HUGE[:20_000]], 431, "max_header_bytes"),
        ([b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"], 501, ""),
        ([b"HELLO\r\n\r\n"], 400, ""),
    ],
    ids=["no-host", "bad-length", "huge-header-at-once", "huge-header-arriving", "te", "junk"],
)
def test_a_refused_head_gets_a_json_error_with_its_status(server, pieces, status, says):
    answer = answer_to(server, *pieces)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert b"content-type: application/json" in head
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == str(status) and says in error["message"]


def test_a_client_that_leaves_during_its_upload_costs_one_log_line(server, caplog):
    caplog.set_level(logging.INFO)
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b"{" * 1000
        )
        sock.close()
    deadline = time.monotonic() + 30  # generous: a loaded 2-core CI machine
    while sum("left during its upload" in r.getMessage() for r in caplog.records) < 3:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.01)
    time.sleep(0.1)  # anything else these requests would log comes with them
    records = [r for r in caplog.records if r.name.startswith(("uvicorn", "omniflow"))]
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR]
    left = [r.getMessage() for r in records if "left during its upload" in r.getMessage()]
    assert len(left) == 3 and "1000 of 100000 bytes" in left[0], left
