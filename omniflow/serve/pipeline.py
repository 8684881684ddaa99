"""The part of a running pipeline the server depends on, as a Protocol.

The server reads only `info()` and `stats()`, observes step times, submits and aborts
requests, and encodes voice-clone references with `reference_encoder()` (the declared
capability of a Base model; None on any other). Typing against this (rather than the
orchestrator class) keeps the server off the orchestrator's internals and lets tests serve a
small fake with the same behaviour, e.g. a pipeline whose stage has died.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from omniflow.build.context import ReferenceEncoder
from omniflow.core.pipeline import PipelineInfo, PipelineStats
from omniflow.core.speech import SpeechRequest
from omniflow.engine.orchestrator import AudioEvent

Sink = Callable[[AudioEvent], None]


class Pipeline(Protocol):
    """What `Orchestrator` offers the server (see omniflow/core/pipeline.py)."""

    def info(self) -> PipelineInfo: ...

    def stats(self) -> PipelineStats: ...

    def reference_encoder(self) -> ReferenceEncoder | None:
        """A Base model's voice-clone encoders; None: the model does not clone voices."""
        ...

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None: ...

    def submit(
        self, speech: SpeechRequest, sink: Sink, max_buffered_s: float | None = None
    ) -> None:
        """ValueError: bad input; PipelineUnavailable: a stage has stopped. With
        `max_buffered_s` the request pauses while that much of its audio is unconsumed."""
        ...

    def consumed(self, request_id: str, samples: int) -> None:
        """The response took `samples` of the request's audio (backpressure credit)."""
        ...

    def abort(self, request_id: str, error: str | None = None) -> None:
        """End the request: its sink's terminal event is an abort, or an error with `error`."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...
