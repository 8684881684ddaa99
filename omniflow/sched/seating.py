"""Who holds a row of the next step. While every resident request fits in a step's
`max_num_seqs` rows they run oldest first; with more residents (`max_resident_seqs`) they
take turns by earliest playback deadline: a stream that has not started playing (a new
arrival) or is near its deadline runs, one far ahead of its playback sits the step out
(docs/architecture.md, earliest deadline first)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import FinishReason, Request
from omniflow.sched.ar_admission import SeatGaps
from omniflow.sched.kv_cache import KVCacheManager
from omniflow.sched.playback import PlaybackClock


def resident_capacity(config: SchedulerConfig, playback: PlaybackClock | None) -> int:
    """How many requests may be resident now: `max_num_seqs`, or up to `max_resident_seqs`
    as many as the rows keep playing at the measured step time (`rotation_capacity`)."""
    rows = config.max_num_seqs
    cap = config.max_resident_seqs or rows
    if cap <= rows or playback is None:
        return rows
    return min(cap, playback.rotation_capacity(rows))


def row_order(
    running: Sequence[Request], rows: int, playback: PlaybackClock | None
) -> list[Request]:
    """The order in which running requests are offered a row: as they came while all fit,
    else by slack (not yet playing first, then the tightest), arrival breaking ties."""
    if len(running) <= rows or playback is None:
        return list(running)
    at = playback.now()

    def deadline(r: Request) -> tuple[float, int]:
        slack = playback.slack(r.request_id, len(r.output_tokens), at)
        return (-math.inf if slack is None else slack, r.arrival)

    return sorted(running, key=deadline)


def rows_for_arrivals(
    waiting: Iterable[Request], paused: Collection[str], free_residents: int, kv: KVCacheManager
) -> int:
    """Rows kept this step for waiting requests that may become resident now: they have no
    audio yet, the earliest deadline of all, so running streams get the rows they leave.
    Counted as the admission loop takes them, in order, while their contexts fit the free
    KV blocks: a row kept for one that cannot be admitted would be a row lost."""
    ready, free = 0, kv.pool.num_free
    for r in waiting:
        if ready >= free_residents:
            break
        if r.request_id in paused or r.input_room == 0:
            continue
        need = kv.blocks_for(r.num_tokens)
        if r.num_placeholders or need > free:
            break
        ready, free = ready + 1, free - need
    return ready


def preemption_victim(
    running: Sequence[Request],
    req: Request,
    paused: Collection[str],
    scheduled: Mapping[str, int],
) -> Request:
    """Who gives up its KV when `req` cannot grow: the newest paused request (it makes no
    progress until its consumer reads, and recomputes when resumed), else the newest not
    already planned this step, else `req` itself."""
    others = [r for r in reversed(running) if r is not req and r.request_id not in scheduled]
    for r in others:
        if r.request_id in paused:
            return r
    return others[0] if others else req


def playing(running: Iterable[Request]) -> list[tuple[str, int]]:
    """(request, frames made) of the streams with a playback deadline: a text-starved one
    (its input has not arrived) has none until it does."""
    return [(r.request_id, len(r.output_tokens)) for r in list(running) if r.input_room != 0]


def first_audio_wait_s(
    waiting: Collection[Request],
    running: Collection[Request],
    residents: int,
    seats: SeatGaps,
    playback: PlaybackClock | None,
) -> float | None:
    """Expected seconds before a request added now is seated and heard on time: the requests
    ahead of it times the measured interval between seats freeing (None: no seat has freed
    yet), or, while steps take longer than the audio they make and a stream is late, how
    late it is (admission control refuses past `server.max_first_audio_wait_s`)."""
    wait = seats.wait_s(len(waiting) + 1 - (residents - len(running)))
    if playback is None:
        return wait
    late = playback.late_s(playing(running))
    return late if late > (wait or 0.0) else wait


def extend_live(
    req: Request, text: str, done: bool, playback: PlaybackClock | None
) -> tuple[FinishReason, str | None] | None:
    """Give a live request more text (`core/live.py`); a text-starved stream's playback
    clock starts again, as it was waiting for text, not late. How it must end now (an
    error: text it cannot take; `length`: its cap, reached before its text ended), or None."""
    if req.live is None:
        why = f"request {req.request_id!r} takes no more input: it was not started incremental"
        return "error", why
    starved = req.input_room == 0
    try:
        req.live.extend(text, done)
    except ValueError as exc:
        return "error", str(exc)
    if starved and playback is not None:
        playback.resume(req.request_id, len(req.output_tokens))
    cap = req.live.length_cap()
    if cap is not None:  # never below what it has made: it may end right here
        most = max(req.num_generated, min(req.sampling.max_new_tokens, cap))
        req.sampling = replace(req.sampling, max_new_tokens=most)
    if req.num_generated >= req.sampling.max_new_tokens and not req.num_placeholders:
        return "length", None  # (an in-flight sample's update ends it at its cap instead)
    return None
