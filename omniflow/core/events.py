"""What a running pipeline hands its caller for one request: PCM events, then one end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omniflow.core.request import FinishReason


@dataclass(frozen=True)
class AudioEvent:
    """PCM for one request (float32 in [-1, 1], mono), or its end."""

    request_id: str
    pcm: np.ndarray | None = None
    frames: int = 0
    """Frames generated so far by the source stage (for progress)."""
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    made_at: float = field(default_factory=time.perf_counter)
    """When the event was made (`time.perf_counter`, on the thread that made it): the server
    splits a request's first-audio latency at this point (`omniflow_first_audio_made_seconds`
    and `omniflow_first_audio_delivery_seconds`)."""
    seated_at: float | None = None
    """When the source stage first seated the request (`time.perf_counter`; None where it
    does not say): splits the pipeline's part into queueing and the steps that made it."""
    text_done_at: float | None = None
    """On a live request's final event: when the router got the source stage's output that
    showed the end of its text taken (`time.perf_counter` in this process; None where none
    did, or the request was not live)."""
    text_done_frames: int = 0
    """On that final event: the frames made up to the step that took it (`frames` minus it:
    the speech made after the text's end)."""


Sink = Callable[[AudioEvent], None]
