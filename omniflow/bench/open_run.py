"""The open loop's arrivals and records, for either transport (HTTP: bench/open_client.py,
WebSocket: bench/ws_client.py): each arrival sent at its time whether or not earlier ones
have ended, its record made from its audio timeline, and the `open_loop` object summing them.

A transport supplies one coroutine, `attempt(trace)`, that sends one arrival and fills its
trace (when it was sent, every audio chunk's time and size, when its text was done) and
answers its outcome; `drive` does the rest: the arrival times, the progress bar, the drain
and the records, also of arrivals aborted in the drain.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tqdm import tqdm

from omniflow.bench.arrivals import arrival_times
from omniflow.bench.mode import Plan
from omniflow.core.player import stalls
from omniflow.logs import BAR_DISABLE

Outcome = Literal["ok", "rejected", "failed"]


@dataclass(frozen=True)
class Request:
    """One arrival, on the run's clock (seconds from its start)."""

    index: int
    arrival_s: float
    """When it was due (its arrival time)."""
    sent_s: float
    """When it was sent (later than arrival_s by the load generator's lag); over WebSocket,
    when its first word was."""
    ended_s: float
    """When its stream ended, or it failed."""
    counted: bool
    """It arrived in the measured window."""
    outcome: Outcome
    error: str | None
    first_audio_s: float | None
    """Sending -> the first non-empty audio bytes (None: no audio came)."""
    e2e_s: float
    """Sending -> the end of its stream (or its failure)."""
    audio_bytes: int
    window_bytes: int
    """Of its audio bytes, those received inside the measured window."""
    stalls: int
    stall_s: float
    """The player's stalls: how many, their total and the largest."""
    largest_stall_s: float
    chunks: tuple[tuple[float, int], ...] = ()
    """Every audio chunk as (seconds since sending, bytes): where first audio and stalls
    came from (the `--out` file's timeline)."""
    after_done_s: float | None = None
    """WebSocket: input.done -> the last audio bytes (None: over HTTP, or no audio or text
    end). Stalls while the text is still coming are the text's pace; this is the model's."""


@dataclass(frozen=True)
class Target:
    """What the arrivals of a run ask the server for, whichever transport sends them: one
    set of fields so both generators take and read them alike."""

    url: str
    """The server's http(s) base address."""
    texts: Sequence[str]
    model: str
    voice: str
    max_frames: int = 0
    """Cap per request (0: none; the model decides the length)."""

    def text(self, index: int) -> str:
        """Arrival `index`'s prompt: the texts in order, from the first, wrapping."""
        return self.texts[index % len(self.texts)]


@dataclass
class Trace:
    """An arrival as it goes: what a record is made of, also when it is aborted."""

    index: int
    arrival_s: float
    sent: float = 0.0  # perf_counter
    done: float | None = None
    """perf_counter when its text was all sent (WebSocket: input.done)."""
    times: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


Attempt = Callable[[Trace], Awaitable[tuple[Outcome, str | None]]]
"""Send one arrival, filling its trace; its outcome and error text."""


def whole_pcm(trace: Trace, what: str) -> tuple[Outcome, str | None]:
    """A finished stream's outcome: ok when it brought whole 16-bit samples."""
    size = sum(trace.sizes)
    if size == 0:
        return "failed", f"no audio: {what} ended empty"
    if size % 2:
        return "failed", f"not whole 16-bit samples: {size} bytes"
    return "ok", None


def record(
    trace: Trace, t0: float, end: float, plan: Plan, outcome: Outcome, error: str | None
) -> Request:
    """The arrival's record: first audio, e2e and the player's stalls from its timeline."""
    start, stop = plan.window
    first = trace.times[0] - trace.sent if trace.times else None
    played = stalls(trace.times, trace.sizes)
    in_window = sum(
        n for t, n in zip(trace.times, trace.sizes, strict=True) if start <= t - t0 < stop
    )
    return Request(
        index=trace.index,
        arrival_s=trace.arrival_s,
        sent_s=trace.sent - t0,
        ended_s=end - t0,
        counted=start <= trace.arrival_s < stop,
        outcome=outcome,
        error=None if error is None else error[:300],
        first_audio_s=first,
        e2e_s=end - trace.sent,
        audio_bytes=sum(trace.sizes),
        window_bytes=in_window,
        stalls=len(played),
        stall_s=sum(s.length_s for s in played),
        largest_stall_s=max((s.length_s for s in played), default=0.0),
        chunks=tuple(
            (round(t - trace.sent, 6), n) for t, n in zip(trace.times, trace.sizes, strict=True)
        ),
        after_done_s=(
            trace.times[-1] - trace.done if trace.times and trace.done is not None else None
        ),
    )


async def drive(plan: Plan, attempt: Attempt) -> list[Request]:
    """Every arrival of the plan, sent at its time by `attempt`; their records, in arrival
    order. Measured arrivals still running `plan.drain_s` after the window are aborted."""
    times = arrival_times(plan.rps, plan.window[1], plan.arrivals, plan.seed)
    records: list[Request | None] = [None] * len(times)
    in_flight = 0
    bar = tqdm(
        total=len(times), desc="open loop: warm-up", unit=" req", leave=False, disable=BAR_DISABLE
    )
    t0 = time.perf_counter()

    async def one(i: int, at: float) -> None:
        nonlocal in_flight
        trace = Trace(i, at)
        outcome: Outcome = "failed"
        error: str | None = "the load generator stopped before it ended"
        in_flight += 1
        try:
            outcome, error = await attempt(trace)
        except asyncio.CancelledError:  # still running when the drain ended
            outcome = "failed"
            error = f"aborted: still running {plan.drain_s:g} s after the measured window closed"
            raise
        finally:
            in_flight -= 1
            if not trace.sent:  # cancelled (or refused) before it was sent
                trace.sent = time.perf_counter()
            records[i] = record(trace, t0, time.perf_counter(), plan, outcome, error)
            bar.update(1)
            bar.set_postfix(in_flight=in_flight, refresh=False)

    tasks: list[asyncio.Task[None]] = []
    measuring = False  # (a bar off a terminal is disabled: it keeps no description)
    try:
        for i, at in enumerate(times):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if at >= plan.warmup_s and not measuring:
                measuring = True
                bar.set_description("open loop: measured")
            tasks.append(asyncio.create_task(one(i, at)))
        bar.set_description("open loop: drain")
        deadline = t0 + plan.window[1] + plan.drain_s
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        bar.close()
    return [r for r in records if r is not None]
