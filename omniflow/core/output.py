"""What a stage engine hands back per request after each step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omniflow.core.request import FinishReason


@dataclass(frozen=True)
class StageOutput:
    """New outputs of one request, and whether it ended (with exactly one terminal output)."""

    request_id: str
    tokens: tuple[int, ...] = ()
    frames: tuple[Any, ...] = ()
    audio: Any = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    held: bool = False
    """The request is alive but paused here (preempted and waiting to be recomputed, or
    paused by backpressure): stages downstream must not count the pause against their
    receive deadline."""
    consumed_frames: int = 0
    """Chunk-receiving stages: frames received from upstream that this output used up (the
    orchestrator's measure of the stage's backlog, docs/reliability.md)."""
    seated_at: float | None = None
    """On an AR request's first tokens: when a plan first seated it (`Request.seated_at`)."""
    text_done_at: float | None = None
    """On the output whose tokens show a live request's end of text taken: when the
    scheduler saw it (`Request.text_done_at`)."""
    text_done_after: int = 0
    """On that output: how many of its tokens came after the one sampled by the step that
    took the end of the text (a window's later steps)."""
