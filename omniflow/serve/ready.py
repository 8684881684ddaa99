"""The line `omniflow serve` logs once it accepts connections, and its URL format.

Kept apart from `run.py` so that a process that only starts a server and waits for it (the
soak bench, tests) can read it without importing the model stack.
"""

from __future__ import annotations

READY = "omniflow ready: accepting connections"
"""Logged once the socket listens. uvicorn's "Application startup complete" comes before
that (its lifespan runs first), so a client that connects on it can be refused; supervisors,
tests and `benchmarks.soak` wait for this line instead."""


def url_of(host: str, port: int) -> str:
    """http://host:port, with an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
