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
from dataclasses import dataclass, fields, replace
from multiprocessing.connection import Connection
from typing import Literal

import numpy as np

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import (
    Overloaded,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    RequestLimits,
)
from omniflow.core.speech import SpeechRequest
from omniflow.engine.messages import ExtendInput
from omniflow.engine.routing import Took

# ---------------------------------------------------------------- server -> engine


@dataclass(frozen=True)
class Submit:
    call: int
    speech: SpeechRequest
    limits: RequestLimits


@dataclass(frozen=True)
class Abort:
    call: int
    request_id: str
    error: str | None


@dataclass(frozen=True)
class Encode:
    """A reference recording to encode (mono float32 at the codec's rate)."""

    call: int
    audio: np.ndarray


ControlName = Literal["stats", "start", "stop", "observe_steps", "time_phases", "untime_phases"]


@dataclass(frozen=True)
class Control:
    """A call without arguments: `stats`, `start`, `stop`, `observe_steps` (from now on,
    each engine step's duration rides with the events), `time_phases` / `untime_phases`
    (each step phase's, on the engine process's host clock, or no longer)."""

    call: int
    name: ControlName


ToEngine = Submit | Took | Abort | ExtendInput | Encode | Control
"""`Took` (flow control) and `ExtendInput` (live text) are the engine's own messages: they
cross as they are, neither waiting for a reply."""

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


@dataclass(frozen=True)
class Events:
    """Events in the order the pipeline made them, and steps timed since the last message."""

    heads: tuple[tuple[object, ...], ...]
    """Each event's fields but its PCM, in `HEAD_FIELDS` order."""
    samples: tuple[int, ...]
    """How many of `pcm`'s samples are each event's own, in order (-1: it has none)."""
    pcm: np.ndarray | None
    """Their PCM back to back (float32); None on the pipe, where its bytes follow the message
    (`send`), so that no audio is pickled."""
    steps: tuple[tuple[str, str, float], ...] = ()
    """(stage, phase, seconds) timed since the last message; phase `OBSERVED`: a whole step
    (the step observer's), any other: a step phase (`time_phases`)."""
    stats: PipelineStats | None = None
    """The pipeline's gauges, pushed now and then while it makes events (`stats()` reads
    them without a call)."""


FromEngine = Ready | Reply | Events

OBSERVED = ""
"""The phase name of a whole step's duration in `Events.steps` (no phase has this name)."""
HEAD_FIELDS = tuple(f.name for f in fields(AudioEvent) if f.name != "pcm")


def pack(
    events: Sequence[AudioEvent],
    steps: Sequence[tuple[str, str, float]] = (),
    stats: PipelineStats | None = None,
) -> Events:
    """The events as one message: heads, and their PCM back to back in one float32 array."""
    parts = [np.asarray(e.pcm, dtype=np.float32).reshape(-1) for e in events if e.pcm is not None]
    samples = tuple(-1 if ev.pcm is None else np.size(ev.pcm) for ev in events)
    heads = tuple(tuple(getattr(ev, name) for name in HEAD_FIELDS) for ev in events)
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return Events(heads, samples, pcm, tuple(steps), stats)


def unpack(message: Events) -> list[AudioEvent]:
    """The events again, each PCM its own copy: a view would keep the whole message's array
    (every request's audio of a step) alive as long as one event's audio is held."""
    out, at = [], 0
    for head, n in zip(message.heads, message.samples, strict=True):
        pcm = None
        if n >= 0:
            assert message.pcm is not None
            pcm = message.pcm[at : at + n].copy()
            at += n
        out.append(AudioEvent(pcm=pcm, **dict(zip(HEAD_FIELDS, head, strict=True))))
    return out


def send(conn: Connection, message: FromEngine) -> None:
    """One message down the pipe; an `Events`' PCM after it as raw bytes (pickling an 8 MB
    array costs several times the copy: the engine process's interpreter lock, held)."""
    if isinstance(message, Events) and message.pcm is not None and message.pcm.size:
        conn.send(replace(message, pcm=None))
        conn.send_bytes(memoryview(message.pcm))
    else:
        conn.send(message)


def receive(conn: Connection) -> FromEngine:
    """The next message, an `Events`' PCM read back from the bytes after it."""
    message: FromEngine = conn.recv()
    if isinstance(message, Events) and message.pcm is None:
        return replace(message, pcm=np.frombuffer(conn.recv_bytes(), dtype=np.float32))
    return message
