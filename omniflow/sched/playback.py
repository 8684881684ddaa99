"""Each stream's playback clock, as the scheduler sees it: from its first frame on, frame n
is due by first-frame time + n frames of audio - a safety margin, or the listener's player
stalls. Slack = that deadline - now; a window may run only as many steps as the tightest
scheduled stream's slack covers (`docs/architecture.md`, slack-sized windows)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

STEP_EWMA = 0.2
"""Weight of the newest step-time sample in the running estimate."""

ROTATION_LOAD = 0.8
"""Of a frame's playback time, the share that steps may take when more streams than rows
take turns (earliest deadline first): the rest absorbs step-time jitter and prefills."""


def rows_bucket(rows: int) -> int:
    """The batch-size class a step time is kept under: the next power of two (1, 2, 4, ...),
    as decode graphs are captured, so a step time stands for the sizes that cost the same."""
    return 1 << max(0, rows - 1).bit_length()


@dataclass
class PlaybackClock:
    """Deadlines per request and the measured time of one decode step."""

    frame_s: float
    """Seconds of audio in one frame."""
    margin_s: float
    """Slack kept in reserve (delivery, the client's own jitter)."""
    chunk_steps: int = 0
    """Inside a window, audio leaves every this many steps (`audio_chunk_frames` below
    `window_k`, sent while the window runs under async scheduling); 0: at its end."""
    now: Callable[[], float] = time.monotonic
    started: dict[str, float] = field(default_factory=dict)
    """Request -> when its first frame was made."""
    step_s: float | None = None
    """Running estimate of one decode step's wall time (None until measured)."""
    step_s_by_rows: dict[int, float] = field(default_factory=dict)
    """The same estimate per batch-size class (`rows_bucket`)."""
    steps_by_rows: dict[int, int] = field(default_factory=dict)
    """How many results each class's estimate has taken in."""
    _planned_at: dict[int, float] = field(default_factory=dict)
    _ended_at: float = 0.0

    def planned(self, step_id: int) -> None:
        self._planned_at[step_id] = self.now()

    def step_done(self, step_id: int, steps: int, rows: int = 1) -> float:
        """A planned step's result is in: its wall time (from when it was planned or when
        the step before it ended, whichever is later) joins the estimate for its `rows`.
        Returns now."""
        now = self.now()
        planned = self._planned_at.pop(step_id, None)
        if planned is not None:
            self.observe_step(now - max(planned, self._ended_at), steps, rows)
        self._ended_at = now
        return now

    def frames_made(self, request_id: str, frames_before: int, at: float) -> None:
        """A step gave the request frames; the first one starts its clock."""
        if frames_before == 0 and request_id not in self.started:
            self.started[request_id] = at

    def resume(self, request_id: str, frames: int) -> None:
        """Text reached a stream that waited for it: its next frame is due a frame from now,
        as for a stream that has just started (it was not late, it had nothing to say)."""
        if request_id in self.started:
            self.started[request_id] = self.now() - (frames - 1) * self.frame_s

    def forget(self, request_id: str) -> None:
        self.started.pop(request_id, None)

    def slack(self, request_id: str, frames: int, at: float) -> float | None:
        """Seconds until the request's next frame is due; None before its first frame."""
        start = self.started.get(request_id)
        if start is None:
            return None
        return start + frames * self.frame_s - self.margin_s - at

    def min_slack(self, streams: Iterable[tuple[str, int]]) -> float | None:
        """The least slack among `streams` (request, frames made) now; None: none playing."""
        at = self.now()
        slacks = [s for rid, n in streams if (s := self.slack(rid, n, at)) is not None]
        return min(slacks, default=None)

    def late_s(self, streams: Iterable[tuple[str, int]]) -> float:
        """How far behind real time the stage is for `streams` (request, frames made): the
        tightest stream's lateness while a step takes longer than a frame of audio lasts,
        else 0. A stage that slow cannot catch up by itself, and another stream would push
        the others further past their deadlines."""
        if self.step_s is None or self.step_s <= self.frame_s:
            return 0.0
        least = self.min_slack(streams)
        return 0.0 if least is None or least >= 0 else -least

    def observe_step(self, seconds: float, steps: int, rows: int = 1) -> None:
        """A result covering `steps` decode steps of `rows` requests took `seconds`."""
        if steps <= 0 or seconds <= 0:
            return
        sample = seconds / steps
        self.step_s = _ewma(self.step_s, sample)
        bucket = rows_bucket(rows)
        self.step_s_by_rows[bucket] = _ewma(self.step_s_by_rows.get(bucket), sample)
        self.steps_by_rows[bucket] = self.steps_by_rows.get(bucket, 0) + 1

    def step_s_at(self, rows: int, measured: bool = False) -> float | None:
        """The step time of `rows` rows: their class's estimate, else the nearest larger
        class measured (an upper bound), else the overall estimate (a guess from smaller
        batches; None with `measured`, or before any step)."""
        bucket = rows_bucket(rows)
        # a snapshot first: admission control reads this from another thread while the
        # engine thread adds classes (list() of a dict copies it in one step under the GIL)
        larger = sorted(b for b in list(self.step_s_by_rows) if b >= bucket)
        if larger:
            return self.step_s_by_rows[larger[0]]
        return None if measured else self.step_s

    def rotation_capacity(self, rows: int) -> int:
        """How many streams `rows` rows can keep playing when they take turns: each stream
        needs a frame per `frame_s`, and a step of `rows` rows gives `rows` frames, so up to
        rows * frame_s / step time streams (less `ROTATION_LOAD`'s reserve); `rows` itself
        until a batch that large has been measured (smaller ones understate the time)."""
        step = self.step_s_at(rows, measured=True)
        if step is None:
            return rows
        return max(rows, math.floor(ROTATION_LOAD * rows * self.frame_s / step))

    def window_steps(self, cap: int, streams: Iterable[tuple[str, int]], at: float) -> int:
        """The most steps (<= cap) a window may run: its audio arrives at its end, so every
        scheduled stream's slack (`window_slack`) must cover them; with audio every
        `chunk_steps` and a step shorter than a frame, only the first chunk's steps (each
        chunk then brings more audio than its steps take, so the later ones come in time),
        and then the whole cap. `streams`: (request, frames made)."""
        streams = list(streams)
        step = self.step_s_at(len(streams))
        if not streams:
            return cap
        if step is None:  # nothing measured yet: a fresh stream gets steps that measure
            return 1 if any(rid not in self.started for rid, _ in streams) else cap
        least = min(self.window_slack(rid, n, at) for rid, n in streams)
        fit = math.floor(least / step)
        if 0 < self.chunk_steps < cap and fit >= self.chunk_steps and step <= self.frame_s:
            return cap
        return max(1, min(cap, fit))

    def window_slack(self, request_id: str, frames: int, at: float) -> float:
        """`slack` for sizing a window. A stream without a clock yet has its first frame in
        flight (async scheduling plans the next step before the prefill's result is in):
        it starts playing about now, with one frame of audio, so its next frame is due a
        frame from now. Left out, it would get a full window and stall a frame later."""
        slack = self.slack(request_id, frames, at)
        return (max(frames, 1) * self.frame_s - self.margin_s) if slack is None else slack


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else (1 - STEP_EWMA) * old + STEP_EWMA * sample
