"""A small pipeline with the orchestrator's public surface and real behaviour, for serving
states the real pipeline reaches only by accident (a stage whose loop died).

It generates a sine, one 1,920-sample frame per request per step on its own thread, keeps
the orchestrator's guarantees (PCM in order, exactly one terminal event, nothing after it),
refuses new work once a stage is dead, and reports gauges like the two-stage pipeline: the
first stage holds a KV block per request, the second a decoder slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import (
    UNBOUNDED,
    Overloaded,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    PrefillCounters,
    RequestLimits,
    StageStats,
    WindowCounters,
)
from omniflow.core.speech import SpeechRequest

SAMPLES_PER_FRAME = 1920
INFO = PipelineInfo(
    model="qwen3-tts-tiny",
    pipeline="fake",
    voices=("ryan", "vivian"),
    languages=("auto", "english"),
    sample_rate=24000,
    max_new_tokens=64,
    supports_instructions=True,
    stages=("talker", "code2wav"),
)


@dataclass
class _Live:
    sink: Callable[[AudioEvent], None]
    total: int
    frames: int = 0
    error: str | None = None
    """Ends with this error at its first step, before any audio."""


class FakePipeline:
    def __init__(self, info: PipelineInfo = INFO, windows: bool = False) -> None:
        self._info = info
        self._windows = windows
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        self._dead: set[str] = set()
        self._die_at_submit: str | None = None
        self._fail_next: str | None = None
        self._observer: Callable[[str, float], None] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.steps = 0
        self.submits = 0
        self.seat_wait_s = 0.0
        """What the fake answers as the wait for a seat (admission by deadline)."""
        self.max_wait_s: float | None = None
        """The wait limit the server passed with the last submit."""
        """submit() calls that reached the pipeline (admission refusals never do)."""
        self.gate = threading.Event()
        """Cleared: requests stay admitted without producing audio (to read gauges)."""
        self.gate.set()

    # ------------------------------------------------------------------ public surface

    def info(self) -> PipelineInfo:
        return self._info

    def reference_encoder(self) -> None:
        """A CustomVoice model's: no voice clone."""
        return None

    def stats(self) -> PipelineStats:
        with self._lock:
            n = len(self._live)
            steps = self.steps
            dead = set(self._dead)
        first, second = self._info.stages
        windows = (
            WindowCounters(steps, 0, 0, {"waiting": 1}, sizes={3: steps}) if self._windows else None
        )
        return PipelineStats(
            in_flight=n,
            stages=(
                StageStats(
                    name=first,
                    alive=first not in dead,
                    running=n,
                    waiting=0,
                    kv_blocks_used=n,
                    kv_blocks_total=64,
                    windows=windows,
                    # distinct values per field, so a metric reading the wrong one shows
                    prefills=PrefillCounters(steps, 7 * steps, max(steps - 1, 0), 2 * steps),
                    min_slack_s=0.25 if n else None,
                ),
                StageStats(
                    name=second,
                    alive=second not in dead,
                    running=n,
                    waiting=0,
                    decoder_slots_used=n,
                    decoder_slots_total=4,
                ),
            ),
        )

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None:
        self._observer = observer

    def submit(
        self,
        speech: SpeechRequest,
        sink: Callable[[AudioEvent], None],
        limits: RequestLimits = UNBOUNDED,
    ) -> None:
        with self._lock:
            self.submits += 1
            self.max_wait_s = max_wait_s = limits.max_wait_s
            if max_wait_s is not None and self.seat_wait_s > max_wait_s:
                raise Overloaded("at capacity", retry_after_s=self.seat_wait_s)
            if self._die_at_submit is not None:
                self._dead.add(self._die_at_submit)
            if self._dead:
                raise PipelineUnavailable(f"stage {sorted(self._dead)[0]!r} has stopped")
            if speech.voice not in self._info.voices:
                raise ValueError(f"unknown voice {speech.voice!r}")
            if speech.request_id in self._live:
                raise ValueError(f"request id {speech.request_id!r} is already running")
            total = speech.max_new_tokens or 8
            self._live[speech.request_id] = _Live(sink, total, error=self._fail_next)
            self._fail_next = None

    def abort(self, request_id: str, error: str | None = None) -> None:
        reason = "abort" if error is None else "error"
        self._end(
            request_id, AudioEvent(request_id, finished=True, finish_reason=reason, error=error)
        )

    def consumed(self, request_id: str, samples: int) -> None:
        """No backpressure here: the fake produces a few frames per request."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    @property
    def stopped(self) -> bool:
        """`stop` was called (a server that failed to start must have called it)."""
        return self._stopping.is_set()

    # ------------------------------------------------------------------ test controls

    def kill(self, stage: str) -> None:
        """The stage's loop dies: each of its requests ends with one error, as in the engine."""
        with self._lock:
            self._dead.add(stage)
            rids = list(self._live)
        for rid in rids:
            error = f"stage {stage} failed: killed"
            self._end(rid, AudioEvent(rid, finished=True, finish_reason="error", error=error))

    def fail_next(self, error: str) -> None:
        """The next request fails in a stage before any audio (as a refused chunk does)."""
        self._fail_next = error

    def die_at_next_submit(self, stage: str) -> None:
        """The stage dies between admission's health check and the submit (a race)."""
        self._die_at_submit = stage

    # ------------------------------------------------------------------ generation

    def _end(self, request_id: str, event: AudioEvent) -> None:
        with self._lock:
            live = self._live.pop(request_id, None)
            if live is not None:
                live.sink(event)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if not self.gate.wait(0.01):
                continue
            with self._lock:
                rids = list(self._live)
            if not rids:
                self._stopping.wait(0.005)
                continue
            with self._lock:  # counted before its audio goes out: a client that has its
                self.steps += 1  # response sees this step in the stats and metrics
            if self._observer is not None:
                for stage in self._info.stages:
                    self._observer(stage, 0.001)
            for rid in rids:
                self._step(rid)

    def _step(self, rid: str) -> None:
        with self._lock:  # sinks are called under the lock: nothing follows a terminal event
            live = self._live.get(rid)
            if live is None:
                return
            if live.error is not None:
                del self._live[rid]
                live.sink(AudioEvent(rid, finished=True, finish_reason="error", error=live.error))
                return
            start = live.frames * SAMPLES_PER_FRAME
            t = np.arange(start, start + SAMPLES_PER_FRAME) / self._info.sample_rate
            pcm = (0.5 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
            live.frames += 1
            live.sink(AudioEvent(rid, pcm=pcm, frames=live.frames))
            if live.frames >= live.total:
                del self._live[rid]
                live.sink(
                    AudioEvent(rid, frames=live.frames, finished=True, finish_reason="length")
                )
