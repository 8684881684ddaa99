"""What passes between the driver and a stage's Ray actor under `pipeline.runtime: ray`
(deploy/stage_actor.py, deploy/remote_stage.py): typed values, pickled by Ray. Nothing here
imports Ray, so the driver-side types are readable without it."""

from __future__ import annotations

from dataclasses import dataclass

from omniflow.core.output import StageOutput
from omniflow.core.pipeline import StageStats
from omniflow.core.speech import SpeechRequest


@dataclass(frozen=True)
class Prepared:
    """The source stage's request, made and checked in its actor by `prepare` (so invalid
    input raises before anything is queued), waiting there for its `Add`."""

    request_id: str


@dataclass(frozen=True)
class Deferred:
    """A stage request the actor makes from `speech` when its `Add` arrives (a receiver's
    request: nothing to check, so no round trip before the `Add`)."""

    speech: SpeechRequest

    @property
    def request_id(self) -> str:
        return self.speech.request_id


@dataclass(frozen=True)
class StageFacts:
    """What the orchestrator reads of a stage once, at build: the source stage's front end
    (`frontend` None elsewhere) and a receiver's largest first chunk."""

    name: str
    frontend: FrontendFacts | None
    clones: bool
    """The stage holds a Base model's reference encoders (voice clone)."""
    max_chunk_frames: int | None


@dataclass(frozen=True)
class FrontendFacts:
    """A `SpeechFrontend`'s plain facts (its `make_request` stays in the actor)."""

    voices: tuple[str, ...]
    languages: tuple[str, ...]
    max_new_tokens: int
    supports_instructions: bool


@dataclass(frozen=True)
class Batch:
    """One answer of `take`: the stage's outputs since the last, the durations of its
    productive steps (metrics), and its gauges now (stats and the admission estimate, read
    by the driver between answers)."""

    outputs: tuple[StageOutput, ...]
    step_seconds: tuple[float, ...]
    stats: StageStats
    first_audio_wait_s: float | None


class NotStarted(RuntimeError):
    """A stage actor asked to make a request before the driver started it (Ray restarted it
    and the driver has not seen the death yet): the driver answers it as a stage that is down."""
