"""How windows and admissions trade off in the AR scheduler (`sched/window.py` plans the
window itself): which waiting requests keep a window from opening; and how long a new
request would wait to be seated (admission control by deadline)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import NamedTuple

from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import Request, RequestState
from omniflow.sched.live_input import playing
from omniflow.sched.playback import ROTATION_LOAD, PlaybackClock, rows_bucket


def admissible_waiting(waiting: Iterable[Request], paused: Collection[str]) -> int:
    """Waiting requests that keep a window from opening (it would delay their admission by its
    k steps); paused and text-starved ones never count."""
    return sum(1 for r in waiting if r.request_id not in paused and r.input_room != 0)


SETTLED_STEPS = 4
"""Results a batch-size class's step time takes in before it may refuse a seat."""

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

    def contended(self, yes: bool) -> None:
        """Whether a request added now would wait for a seat (told each planned step). Gaps
        are measured only between frees of one contended spell: across an idle spell, or
        one with seats to spare, seats are not slow to free, only not needed."""
        if not yes:
            self._last = None

    def planned(
        self,
        waiting: int,
        running: int,
        free: int,
        playback: PlaybackClock | None,
        rows: int,
    ) -> None:
        """A step is planned with `waiting` queued, `running` seated and `free` seats: is it
        contended (would a request added now wait for a seat, `usable_seats`)?"""
        self.contended(waiting >= usable_seats(free, running, playback, rows))

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
    rows: int,
    hold_s: float = 0.0,
) -> float | None:
    """Expected seconds before a request added now is heard on time (admission control
    refuses past `server.max_first_audio_wait_s`): the requests ahead of it times the
    measured interval between seats freeing (None: no seat has freed yet), then, with a
    playback clock, the step in flight and its own at the measured step time. A free seat
    counts only while one more stream keeps time (`keeps_time`): past that, a stream seated
    now would make every stream late, so it waits for one to leave. While steps take longer
    than the audio they make and a stream is late, how late it is, if that is longer.
    `hold_s`: how long it would be held besides (`arrival_hold`)."""
    if not running and not waiting:
        return 0.0  # idle: no one to wait for, and no step in flight (nor one to measure)
    if hold_s:
        wait = first_audio_wait_s(waiting, running, free, seats, playback, rows)
        return None if wait is None else wait + hold_s
    free = usable_seats(free, len(running), playback, rows)
    wait = seats.wait_s(len(waiting) + 1 - free)
    if playback is None:
        return wait
    step = playback.step_s_at(min(len(running) + 1, rows))
    if wait is not None and step is not None:
        wait += 2 * step
    late = playback.late_s(playing(running))
    return late if late > (wait or 0.0) else wait


def usable_seats(free: int, running: int, playback: PlaybackClock | None, rows: int) -> int:
    """The free seats a request added now could take: none while one more stream would not
    keep time (`keeps_time`), since seated it would make every stream late."""
    if playback is not None and free > 0 and not keeps_time(playback, running + 1, rows):
        return 0
    return free


def keeps_time(playback: PlaybackClock, streams: int, rows: int) -> bool:
    """Whether `streams` streams, `rows` a step, keep playing at the measured step time:
    each makes a frame per step it runs, so the steps they need per frame of audio must fit
    `ROTATION_LOAD` of its playback time, the reserve EDF seating keeps too (the rest
    absorbs jitter: at the whole frame, the 2-core CPU's streams stalled). A class's time
    counts once it has taken in `SETTLED_STEPS` results (its first step, a prefill or a
    first-time launch, overstates it); an unsettled class is bounded below by the largest
    settled smaller one (more rows never step faster). True with none settled."""
    bucket = rows_bucket(min(streams, rows))
    counts = list(playback.steps_by_rows.items())  # a snapshot: the engine thread adds classes
    settled = [b for b, n in counts if n >= SETTLED_STEPS and b <= bucket]
    if not settled:
        return True
    step = playback.step_s_by_rows[max(settled)]
    turns = -(-streams // rows)  # steps until every stream has had one
    return turns * step <= ROTATION_LOAD * playback.frame_s


def queued_at(playback: PlaybackClock | None, sent_at: float | None) -> float:
    """When a request was sent, on the playback clock: now less how long ago it was sent
    (`time.monotonic`; at most 0, so a clock from elsewhere never makes it later)."""
    now = playback.now() if playback is not None else 0.0
    return now if sent_at is None else now - max(0.0, time.monotonic() - sent_at)


def holds(
    waiting: Iterable[Request],
    running: Collection[Request],
    paused: Collection[str],
    config: SchedulerConfig,
    playback: PlaybackClock | None,
) -> bool:
    """Whether a new request would be held now (`arrival_hold_ms`): only while at least
    `arrival_hold_min_running` streams run that take steps (paused ones and those waiting for
    text do not: with none there are no windows to batch arrivals beside), at a measured step
    time the hold covers two steps of (a shorter one could never hold), and while no
    preempted request waits (it plays already: it goes in at once, with whatever waits
    beside it)."""
    return (
        _hold_steps(config.arrival_hold_ms / 1000, waiting, running, paused, config, playback) > 1
    )


def _hold_steps(
    left_s: float,
    waiting: Iterable[Request],
    running: Collection[Request],
    paused: Collection[str],
    config: SchedulerConfig,
    playback: PlaybackClock | None,
) -> int:
    """Steps of the running streams that `left_s` covers (0 where nothing is held)."""
    if not config.arrival_hold_ms or playback is None:
        return 0
    taking = [r for r in running if r.request_id not in paused and r.input_room != 0]
    if len(taking) < config.arrival_hold_min_running:  # at least 1: none running holds none
        return 0  # below the batch the hold is for: an arrival goes in at once
    if any(r.state is RequestState.PREEMPTED for r in waiting):
        return 0
    step = playback.step_s_at(min(len(taking), config.max_num_seqs), measured=True)
    return 0 if step is None else math.floor(left_s / step + 1e-9)  # ties: the step fits


class Hold(NamedTuple):
    """What `arrival_hold_ms` does now (`arrival_hold`)."""

    left_s: float
    """How long a request added now would still be held (admission control adds it): the
    rest of the oldest held arrival's hold (the waiting ones are seated when it ends), the
    whole hold with none waiting; 0: not held."""
    steps: int | None
    """Steps the running streams may still run before the held arrivals are seated (while a
    window of at least two steps fits); None: seat the waiting ones now."""


def arrival_hold(
    waiting: Collection[Request],
    paused: Collection[str],
    queued_at: Mapping[str, float],
    running: Collection[Request],
    config: SchedulerConfig,
    playback: PlaybackClock | None,
) -> Hold:
    """The hold now (`holds`); `queued_at`: when each waiting request was sent, on the
    playback clock. With none waiting, windows run no longer than the hold, so a request
    sent meanwhile is taken in (its hold counting from when it was sent) within it."""
    hold_s = config.arrival_hold_ms / 1000
    queue = (waiting, running, paused, config, playback)
    whole = _hold_steps(hold_s, *queue)
    if playback is None or whole < 2:  # `holds` is false
        return Hold(0.0, None)
    seatable = [r for r in waiting if r.request_id not in paused and r.input_room != 0]
    if not seatable:
        return Hold(hold_s, whole)
    oldest = min(queued_at.get(r.request_id, -math.inf) for r in seatable)
    left = max(0.0, hold_s - (playback.now() - oldest))
    steps = _hold_steps(left, *queue)
    return Hold(left, steps) if steps >= 2 else Hold(0.0, None)
