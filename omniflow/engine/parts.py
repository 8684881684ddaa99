"""What one stage's engine is built from: a builder's answer (`build/`), read by the
engine and the orchestrator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import ReferenceEncoder
from omniflow.engine.connector import ChunkIntake
from omniflow.engine.contracts import Runner, Scheduler


class SpeechFrontend(Protocol):
    """The source stage's view of a speech request: what it accepts and how it becomes the
    stage's engine request. Raises ValueError on input it cannot serve."""

    voices: tuple[str, ...]
    languages: tuple[str, ...]
    max_new_tokens: int
    supports_instructions: bool

    def make_request(self, speech: SpeechRequest) -> Any: ...


@dataclass(frozen=True)
class StageParts:
    """One built stage, before it is wrapped in an engine."""

    scheduler: Scheduler
    runner: Runner
    make_request: Callable[[SpeechRequest], Any]
    """The stage's engine request for an admitted speech request."""
    frontend: SpeechFrontend | None = None
    """Set by source stages (the ones taking the request's text)."""
    reference: ReferenceEncoder | None = None
    """Source stages of a Base model: the voice-clone reference encoders (front ends encode
    a reference recording with them before submitting; `Orchestrator.reference_encoder`)."""
    intake: ChunkIntake | None = None
    """Set by stages that receive chunks from an upstream stage."""
    max_chunk_frames: int | None = None
    """Receivers: the largest first chunk a request may ask for (the budget rule)."""
