"""What passes between the server's process and the engine's (`pipeline.runtime: process`,
`engine/process_pipeline.py` and `engine/process_child.py`): typed messages over one pipe.

The PCM of everything a step made crosses as one array per message (`Events.pcm`, the events'
samples back to back), not one pickled array per frame; each event's head says how many of
those samples are its own. Times (`made_at`, `seated_at`, `text_done_at`) are
`time.perf_counter` values of the engine's process: the same clock in both processes
(CLOCK_MONOTONIC on Linux), so the server splits first-audio latency as it does in-process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import (
    Overloaded,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    RequestLimits,
)
from omniflow.core.request import FinishReason
from omniflow.core.speech import SpeechRequest

# ---------------------------------------------------------------- server -> engine


@dataclass(frozen=True)
class Submit:
    call: int
    speech: SpeechRequest
    limits: RequestLimits


@dataclass(frozen=True)
class Consumed:
    request_id: str
    samples: int


@dataclass(frozen=True)
class Abort:
    call: int
    request_id: str
    error: str | None


@dataclass(frozen=True)
class Extend:
    request_id: str
    text: str
    done: bool


@dataclass(frozen=True)
class Encode:
    """A reference recording to encode (mono float32 at the codec's rate)."""

    call: int
    audio: np.ndarray


@dataclass(frozen=True)
class Control:
    """A call without arguments: `stats`, `start`, `stop`, or `observe_steps` (from now on,
    each engine step's duration rides with the events)."""

    call: int
    name: Literal["stats", "start", "stop", "observe_steps"]


ToEngine = Submit | Consumed | Abort | Extend | Encode | Control

# ---------------------------------------------------------------- engine -> server


@dataclass(frozen=True)
class Ready:
    """The pipeline is built (not started)."""

    info: PipelineInfo
    clones: bool
    """Whether it has reference encoders (`Pipeline.reference_encoder()` is not None)."""


@dataclass(frozen=True)
class Failure:
    """What a call (or the build) raised, to be raised again on the server's side."""

    kind: Literal["value", "unavailable", "overloaded", "config", "other"]
    message: str
    config: tuple[tuple[str, str], ...] = ()
    """A `ConfigError`'s (or each of `ConfigErrors`') key path and reason."""
    retry_after_s: float = 0.0

    @staticmethod
    def of(exc: BaseException) -> Failure:
        from omniflow.errors import ConfigError, ConfigErrors

        if isinstance(exc, Overloaded):
            return Failure("overloaded", str(exc), retry_after_s=exc.retry_after_s)
        if isinstance(exc, PipelineUnavailable):
            return Failure("unavailable", str(exc))
        if isinstance(exc, ConfigError):
            errors = exc.errors if isinstance(exc, ConfigErrors) else [exc]
            return Failure("config", str(exc), config=tuple((e.key, e.reason) for e in errors))
        if isinstance(exc, ValueError):
            return Failure("value", str(exc))
        return Failure("other", f"{type(exc).__name__}: {exc}")

    def error(self) -> Exception:
        from omniflow.errors import ConfigError, ConfigErrors

        if self.kind == "overloaded":
            return Overloaded(self.message, self.retry_after_s)
        if self.kind == "unavailable":
            return PipelineUnavailable(self.message)
        if self.kind == "config":
            errors = [ConfigError(key, reason) for key, reason in self.config]
            return errors[0] if len(errors) == 1 else ConfigErrors(errors)
        if self.kind == "value":
            return ValueError(self.message)
        return RuntimeError(f"in the engine process: {self.message}")


@dataclass(frozen=True)
class Reply:
    call: int
    value: object = None
    failure: Failure | None = None


class EventHead(NamedTuple):
    """An `AudioEvent` without its PCM: `samples` of `Events.pcm` are its own (-1: none)."""

    request_id: str
    samples: int
    frames: int
    finished: bool
    finish_reason: FinishReason | None
    error: str | None
    made_at: float
    seated_at: float | None
    text_done_at: float | None
    text_done_frames: int


@dataclass(frozen=True)
class Events:
    """Events in the order the pipeline made them, and steps timed since the last message."""

    heads: tuple[EventHead, ...]
    pcm: np.ndarray
    steps: tuple[tuple[str, float], ...] = ()
    stats: PipelineStats | None = None
    """The pipeline's gauges, pushed now and then while it makes events (`stats()` reads
    them without a call)."""


FromEngine = Ready | Reply | Events


def pack(
    events: Sequence[AudioEvent],
    steps: Sequence[tuple[str, float]] = (),
    stats: PipelineStats | None = None,
) -> Events:
    """The events as one message: heads, and their PCM back to back in one float32 array."""
    heads, parts = [], []
    for ev in events:
        n = -1
        if ev.pcm is not None:
            pcm = np.asarray(ev.pcm, dtype=np.float32).reshape(-1)
            parts.append(pcm)
            n = pcm.size
        heads.append(
            EventHead(
                ev.request_id,
                n,
                ev.frames,
                ev.finished,
                ev.finish_reason,
                ev.error,
                ev.made_at,
                ev.seated_at,
                ev.text_done_at,
                ev.text_done_frames,
            )
        )
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return Events(tuple(heads), pcm, tuple(steps), stats)


def unpack(message: Events) -> list[AudioEvent]:
    """The events again, each PCM its own copy: a view would keep the whole message's array
    (every request's audio of a step) alive as long as one event's audio is held."""
    out, at = [], 0
    for h in message.heads:
        pcm = None
        if h.samples >= 0:
            pcm = message.pcm[at : at + h.samples].copy()
            at += h.samples
        out.append(
            AudioEvent(
                h.request_id,
                pcm,
                frames=h.frames,
                finished=h.finished,
                finish_reason=h.finish_reason,
                error=h.error,
                made_at=h.made_at,
                seated_at=h.seated_at,
                text_done_at=h.text_done_at,
                text_done_frames=h.text_done_frames,
            )
        )
    return out
