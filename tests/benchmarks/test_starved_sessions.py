"""`benchmarks.starved_sessions`' closed-loop round: a run whose requests failed is a
summary with them counted (the load generator's exit status 3), not a crash."""

from __future__ import annotations

import argparse
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.starved_sessions import closed_loop


class Overloaded(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b'{"error": {"message": "overloaded"}}'
        self.send_response(503)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


def test_failed_requests_come_back_counted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Overloaded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = argparse.Namespace(
            url=url, concurrency=1, num_prompts=2, max_frames=2, model="m", voice="v"
        )
        summary = closed_loop(args)
    finally:
        server.shutdown()
        server.server_close()
    assert summary["failed"] == 2 and summary["requests"] == 2
