"""Who holds a row of the next step. While every resident request fits in a step's
`max_num_seqs` rows they run oldest first; with more residents (`max_resident_seqs`) they
take turns by earliest playback deadline: a stream that has not started playing (a new
arrival) or is near its deadline runs, one far ahead of its playback sits the step out
(docs/architecture.md, earliest deadline first)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import Request
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


def free_seats(
    config: SchedulerConfig, playback: PlaybackClock | None, running: Collection[Request]
) -> int:
    """How many more requests may become resident now. A text-starved stream (its next text
    token has not arrived) takes no turn at the rows, so only the others count against
    `resident_capacity`; every resident holds a decoder slot and its KV, so all of them
    count against `max_resident_seqs` (or `max_num_seqs`)."""
    taking_turns = sum(1 for r in running if r.input_room != 0)
    slots = config.max_resident_seqs or config.max_num_seqs
    return min(resident_capacity(config, playback) - taking_turns, slots - len(running))


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
) -> tuple[int, int]:
    """Rows kept this step for waiting requests that may become resident now: they have no
    audio yet, the earliest deadline of all, so running streams get the rows they leave.
    Counted as the admission loop takes them, in order, while their contexts fit the free
    KV blocks: a row kept for one that cannot be admitted would be a row lost. Returns
    (those rows, the free KV blocks their contexts leave)."""
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
    return ready, free


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


def arrivals_alone(
    running: Iterable[Request],
    arrivals: int,
    queued: int,
    held: Collection[str],
    rows: int,
    spare_blocks: int,
    playback: PlaybackClock | None,
) -> bool:
    """Whether the running streams sit this step out so that `arrivals` requests are
    prefilled alone: a prefill step of a few prompts is shorter than one that also decodes
    every running row, and an arrival's first audio waits for all of it. Only while every
    stream that would run (not `held`: fenced or paused) is decoding and has a frame of
    audio in hand beyond its margin, and at least two steps of `rows` rows at the measured
    step time (this one and its own next): a fresh stream, its second frame due a frame
    after its first, would be made late (a prefill step takes longer than the decode steps
    that set the estimate). Not when more are `queued` than can be seated (saturated: each
    seat freed would cost the running streams a step) nor when the KV blocks left after the
    arrivals' (`spare_blocks`) could not hold a next token of each running stream and each
    arrival (one would be preempted next step: the newest, an arrival). A stream still in
    its prompt keeps the step as it is."""
    if not arrivals or queued > arrivals or playback is None:
        return False
    turn = [r for r in running if r.request_id not in held and r.input_room != 0]
    if not turn or spare_blocks < len(turn) + arrivals:
        return False
    if any(r.num_tokens - r.num_computed_tokens > 1 for r in turn):
        return False
    step = playback.step_s_at(min(len(turn), rows))
    if step is None:
        return False  # no step measured yet: no telling what two steps take
    at = playback.now()
    least = min(playback.window_slack(r.request_id, len(r.output_tokens), at) for r in turn)
    return least >= max(playback.frame_s, 2 * step)
