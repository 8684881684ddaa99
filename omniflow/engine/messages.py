"""Typed messages into a stage engine's inbox.

Everything that reaches an engine from another thread (the HTTP loop, another stage's engine)
is one of these values, applied on the engine's own thread in arrival order. Data, not
closures: a stage could live in another process and receive the same messages over IPC, and
a log line can say what arrived.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omniflow.core.request import FinishReason


@dataclass(frozen=True)
class Add:
    """Admit a request (a refusal becomes one error output)."""

    request: Any
    """The stage scheduler's request object (built by the stage's request factory)."""
    initial_chunk_frames: int | None = None
    """Chunk-receiving stages: this request's first-chunk size (None: the edge's)."""
    sent_at: float = field(default_factory=time.monotonic)
    """When it was sent (this process's monotonic clock): a hold of arrivals counts from it,
    not from when the engine thread got to it (`scheduler.arrival_hold_ms`)."""


@dataclass(frozen=True)
class Abort:
    """End a request now; one terminal output if it was still here."""

    request_id: str
    reason: FinishReason = "abort"
    error: str | None = None


@dataclass(frozen=True)
class ReceiveFrames:
    """Frames produced upstream for a request; `finished` marks its last ones."""

    request_id: str
    frames: tuple[tuple[int, ...], ...]
    finished: bool


@dataclass(frozen=True)
class Hold:
    """The request is paused upstream (preempted): its receive deadline waits for the next
    frames instead of running."""

    request_id: str


@dataclass(frozen=True)
class Pause:
    """Backpressure: whoever consumes the request's output here is behind (its client, or the
    downstream stage's backlog). The scheduler holds it out of planning, keeping its state
    (KV blocks, decoder slot, queued chunks), and announces it downstream as held."""

    request_id: str


@dataclass(frozen=True)
class Resume:
    """The consumer caught up: plan the paused request again."""

    request_id: str


@dataclass(frozen=True)
class ExtendInput:
    """More text for a request started as incremental (`core/live.py`); `done`: the last."""

    request_id: str
    text: str
    done: bool


@dataclass(frozen=True)
class Wake:
    """Does nothing but wake the loop (shutdown, tests waiting for drops to apply)."""


EngineMessage = Add | Abort | ReceiveFrames | Hold | Pause | Resume | ExtendInput | Wake
