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


@dataclass
class PlaybackClock:
    """Deadlines per request and the measured time of one decode step."""

    frame_s: float
    """Seconds of audio in one frame."""
    margin_s: float
    """Slack kept in reserve (delivery, the client's own jitter)."""
    now: Callable[[], float] = time.monotonic
    started: dict[str, float] = field(default_factory=dict)
    """Request -> when its first frame was made."""
    step_s: float | None = None
    """Running estimate of one decode step's wall time (None until measured)."""
    _planned_at: dict[int, float] = field(default_factory=dict)
    _ended_at: float = 0.0

    def planned(self, step_id: int) -> None:
        self._planned_at[step_id] = self.now()

    def step_done(self, step_id: int, steps: int) -> float:
        """A planned step's result is in: its wall time (from when it was planned or when
        the step before it ended, whichever is later) joins the estimate. Returns now."""
        now = self.now()
        planned = self._planned_at.pop(step_id, None)
        if planned is not None:
            self.observe_step(now - max(planned, self._ended_at), steps)
        self._ended_at = now
        return now

    def frames_made(self, request_id: str, frames_before: int, at: float) -> None:
        """A step gave the request frames; the first one starts its clock."""
        if frames_before == 0 and request_id not in self.started:
            self.started[request_id] = at

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

    def observe_step(self, seconds: float, steps: int) -> None:
        """A result covering `steps` decode steps took `seconds` of wall time."""
        if steps <= 0 or seconds <= 0:
            return
        sample = seconds / steps
        self.step_s = (
            sample if self.step_s is None else (1 - STEP_EWMA) * self.step_s + STEP_EWMA * sample
        )

    def window_steps(self, cap: int, streams: Iterable[tuple[str, int]], at: float) -> int:
        """The most steps (<= cap) a window may run: its audio arrives at its end, so every
        scheduled stream's slack must cover them. `streams`: (request, frames made)."""
        if self.step_s is None:
            return cap  # nothing measured yet: the gates alone decide
        slacks = [s for rid, n in streams if (s := self.slack(rid, n, at)) is not None]
        if not slacks:
            return cap
        return max(1, min(cap, math.floor(min(slacks) / self.step_s)))
