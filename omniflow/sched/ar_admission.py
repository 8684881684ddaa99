"""How windows and admissions trade off in the AR scheduler (`sched/window.py` plans the
window itself): which waiting requests keep a window from opening; and how long a new
request would wait to be seated (admission control by deadline)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from omniflow.core.request import Request
from omniflow.sched.live_input import playing
from omniflow.sched.playback import PlaybackClock


def admissible_waiting(waiting: Iterable[Request], paused: Collection[str]) -> int:
    """Waiting requests that keep a window from opening (it would delay their admission by its
    k steps); paused and text-starved ones never count."""
    return sum(1 for r in waiting if r.request_id not in paused and r.input_room != 0)


SEAT_EWMA = 0.1
"""Weight of the newest gap in the estimate of how often a seat frees."""


class SeatGaps:
    """How often a running request leaves its seat: with the queue ahead of a new request,
    how long it would wait to be seated (admission control refuses what would wait too
    long, instead of queueing it for seconds)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.interval_s: float | None = None
        self._last: float | None = None

    def freed(self) -> None:
        now = self.clock()
        if self._last is not None:
            gap = now - self._last
            old = self.interval_s
            self.interval_s = gap if old is None else (1 - SEAT_EWMA) * old + SEAT_EWMA * gap
        self._last = now

    def wait_s(self, ahead: int) -> float | None:
        """Seconds until `ahead` more seats free (0 when none is needed; None: unknown)."""
        if ahead <= 0:
            return 0.0
        return None if self.interval_s is None else ahead * self.interval_s


def first_audio_wait_s(
    waiting: Collection[Request],
    running: Collection[Request],
    free: int,
    seats: SeatGaps,
    playback: PlaybackClock | None,
) -> float | None:
    """Expected seconds before a request added now is seated and heard on time: the requests
    ahead of it times the measured interval between seats freeing (None: no seat has freed
    yet), or, while steps take longer than the audio they make and a stream is late, how
    late it is (admission control refuses past `server.max_first_audio_wait_s`)."""
    wait = seats.wait_s(len(waiting) + 1 - free)
    if playback is None:
        return wait
    late = playback.late_s(playing(running))
    return late if late > (wait or 0.0) else wait
