"""How a request's audio events cross from the engine threads into the HTTP event loop: onto
a per-request asyncio queue, with one wake-up of the loop per burst of events
(`LoopHandoff`), and, taken off it, merged with the same request's events already waiting
(`merge_waiting`), so a loop that falls behind sends fewer, larger chunks."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import numpy as np

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import Sink


class LoopHandoff:
    """Events from the engine threads onto the event loop's queues, with one wake-up of the
    loop per burst instead of one per event.

    Why: `call_soon_threadsafe` writes to the loop's self-pipe on every call, a system call
    on the engine thread, and an engine step emits one event per request, so at high
    concurrency waking the loop once per event takes a visible share of every step. Here an
    event is appended under a lock and only the first of a burst schedules the drain; each
    request's events keep their order.

    A request's first event goes ahead of the burst's others: the loop wakes the waiting
    handlers in the order their queues are fed, so a new stream's first audio would
    otherwise wait for every running stream's write of that step; running streams are ahead
    of their playback by then, and its listener is waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        """The loop whose queues this feeds (a server builds one per serving loop)."""
        self._lock = threading.Lock()
        self._first: list[tuple[asyncio.Queue[AudioEvent], AudioEvent]] = []
        self._pending: list[tuple[asyncio.Queue[AudioEvent], AudioEvent]] = []

    def put(self, events: asyncio.Queue[AudioEvent], ev: AudioEvent, first: bool = False) -> None:
        """`first`: the request's first event (nothing of it is pending to be overtaken)."""
        with self._lock:
            (self._first if first else self._pending).append((events, ev))
            if len(self._first) + len(self._pending) > 1:
                return  # a drain is already scheduled
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nothing will drain, say so every time
            with self._lock:
                self._first.clear()
                self._pending.clear()
            raise

    def _drain(self) -> None:
        with self._lock:
            first, self._first = self._first, []
            pending, self._pending = self._pending, []
        for events, ev in first + pending:
            events.put_nowait(ev)


def event_channel(handoff: LoopHandoff) -> tuple[asyncio.Queue[AudioEvent], Sink]:
    """A queue on the handoff's loop and a sink any thread may call to feed it."""
    events: asyncio.Queue[AudioEvent] = asyncio.Queue()
    heard = False  # one thread feeds a request's sink (its router or the engine link's reader)

    def sink(ev: AudioEvent) -> None:
        nonlocal heard
        handoff.put(events, ev, first=not heard)
        heard = True

    return events, sink


def merge_waiting(ev: AudioEvent, events: asyncio.Queue[AudioEvent]) -> AudioEvent:
    """`ev` and every event of the same request already waiting behind it, as one: their PCM
    concatenated, the furthest progress, the last one's ending. Sending an event costs the
    event loop about the same work whatever its size; when the loop falls behind the engine
    (many streams, one event per frame each), a request's events queue up, and sending them
    as one chunk does that work once. A loop that keeps up finds nothing waiting, so latency
    is unchanged."""
    if ev.finished or events.empty():
        return ev
    parts = [ev.pcm] if ev.pcm is not None else []
    last = ev
    frames = ev.frames  # progress: an ending event may not carry it
    while not last.finished and not events.empty():
        last = events.get_nowait()
        frames = max(frames, last.frames)
        if last.pcm is not None:
            parts.append(last.pcm)
    if last is ev:
        return ev
    pcm = None if not parts else parts[0] if len(parts) == 1 else np.concatenate(parts)
    # the last event's ending, the first one's timings (when the audio began to be made)
    return replace(last, pcm=pcm, frames=frames, made_at=ev.made_at, seated_at=ev.seated_at)
