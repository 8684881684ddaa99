"""How many voice-clone references are decoded and encoded at once (docs/reliability.md,
"Clients that misbehave").

A reference costs memory in proportion to its size while it is handled: the request body,
its JSON text, the decoded file, the samples at the source rate and resampled, the encoders'
activations; a 15 MB reference, ~100 MB. Unbounded, 32 registrations at once took the
server to 3.3 GB and its event loop (sharing the CPU and the GIL with 32 decoding threads) to
seconds per `/health`. `ReferenceGate` gives `server.max_concurrent_references` places; a
request past them is a 429 with Retry-After at once, before its body is read when it
declares one large enough to carry a reference (`REFERENCE_BODY_BYTES`). The work runs on
the gate's own threads (one per place, so the allocator keeps one arena per place, not one
per thread that ever decoded), and when the last place is given back the free heap is
returned to the system (`core/heap.py` `malloc_trim`), as the server does when requests go idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from omniflow.serve.errors import ApiError
from omniflow.serve.request_body import parse_body

T = TypeVar("T")
Body = TypeVar("Body", bound=BaseModel)
REFERENCE_BODY_BYTES = 256 * 1024
"""A body larger than this is taken to carry a reference: every other field together is far
smaller (the text fields are bounded by `server.max_input_chars`)."""


class ReferenceGate:
    """`places` references handled at once, on `places` threads; more is a 429."""

    def __init__(self, places: int, release_memory: Callable[[], object] | None) -> None:
        self.places = places
        self.busy = 0
        self.release_memory = release_memory
        self.executor = ThreadPoolExecutor(places, thread_name_prefix="omniflow-reference")

    def place(self, request: Request) -> Place:
        """The request's place, taken now if its body is large enough to carry a reference
        (so that such a body is read only within the bound), else when it needs one."""
        place = Place(self)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > REFERENCE_BODY_BYTES:
            place.take(unread=True)
        return place

    async def parse(self, place: Place, raw: bytes, model: type[Body]) -> Body:
        """`parse_body(raw, model)`: on the gate's threads for a body that took its place
        before it was read (decoding and validating megabytes of JSON takes tens of
        milliseconds, which on the event loop every other client would wait out), inline
        for any other."""
        if not place.held:
            return parse_body(raw, model)
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, parse_body, raw, model
        )

    async def run(self, place: Place, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` on the gate's threads, within `place` (taken now if it is not)."""
        place.take()
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _take(self, unread: bool) -> None:
        """A place, or a 429; refused before its body was read (`unread`), the connection
        is closed after the answer rather than read to the end of a body nobody wants."""
        if self.busy >= self.places:
            headers = {"Retry-After": "1"} | ({"Connection": "close"} if unread else {})
            raise ApiError(
                429,
                f"{self.places} voice-clone reference(s) are being decoded already "
                f"(server.max_concurrent_references); retry shortly",
                "ref_audio",
                "rate_limit_error",
                headers,
            )
        self.busy += 1

    def _give(self) -> None:
        self.busy -= 1
        if self.busy == 0 and self.release_memory is not None:
            self.executor.submit(self.release_memory)


class Place:
    """One request's place in the gate: a context manager that gives it back (if taken)
    when the request's reference work is over."""

    def __init__(self, gate: ReferenceGate) -> None:
        self.gate = gate
        self.held = False

    def take(self, unread: bool = False) -> None:
        if not self.held:
            self.gate._take(unread)
            self.held = True

    def __enter__(self) -> Place:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.held = False
            self.gate._give()
