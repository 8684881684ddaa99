"""The engine's process under `pipeline.runtime: process`: the whole pipeline, built and run
here, answering the server's process over one pipe (`engine/process_wire.py`).

Why a process: the server's event loop (HTTP, 16-bit conversion, one send per event) and
the engine's threads share one interpreter lock in-process; here the engine has its own.

Two threads talk to the pipe: this one reads calls and runs them, and the outbox's sender
writes what the pipeline made and the calls' replies, in the order they happened (an abort's
reply follows its terminal event, so the server's `abort` returns after its sink got it).
When the server's process ends first (its pipes close), this process exits, whichever thread
sees it first: the reader (the pipeline stopped) or `watch_server` (at once, even mid-build):
no engine outlives its server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing.connection import Connection

import numpy as np
import torch

from omniflow.config.graph import StageGraph
from omniflow.core.events import AudioEvent
from omniflow.core.heap import IDLE_TRIM_S, IdleRelease, malloc_trim
from omniflow.core.pipeline import NoTimer, PipelineStats
from omniflow.engine.messages import ExtendInput
from omniflow.engine.orchestrator import Orchestrator
from omniflow.engine.process_wire import (
    OBSERVED,
    Abort,
    Control,
    Encode,
    Failure,
    FromEngine,
    Ready,
    Reply,
    Submit,
    ToEngine,
    pack,
    send,
)
from omniflow.engine.routing import Took
from omniflow.logs import setup_logging

log = logging.getLogger(__name__)

STATS_EVERY_S = 0.05
"""How often, at most, the pipeline's gauges ride with its events to the server's process."""
SENDER_FAILED = 70
"""The engine process's exit status when its sender failed (EX_SOFTWARE)."""
SERVER_GONE = 71
"""Its exit status when the server's process ended first (EX_OSERR)."""
GONE = "the server's process is gone: the engine process exits"
ENCODE_THREADS = 4
"""Reference encodes at once (the server bounds them first: `max_concurrent_references`)."""


class Outbox:
    """Events, step times and replies, sent in order by one thread: each batch of events
    made since the last send goes as one message (its PCM in one array)."""

    def __init__(self, conn: Connection, stats: Callable[[], PipelineStats]) -> None:
        self.conn = conn
        self.stats = stats
        """The pipeline's gauges, pushed with events every `STATS_EVERY_S` at most."""
        self.stats_at = 0.0
        self.ready = threading.Condition()
        self.items: list[AudioEvent | Reply] = []
        self.steps: list[tuple[str, str, float]] = []
        self.closed = False
        self.thread = threading.Thread(target=self._send_all, name="engine-outbox", daemon=True)
        self.thread.start()

    def event(self, ev: AudioEvent) -> None:
        """Every request's sink."""
        self._put(ev)

    def reply(self, reply: Reply) -> None:
        self._put(reply)

    def step(self, stage: str, seconds: float) -> None:
        """A whole step's duration (the step observer)."""
        self.phase(stage, OBSERVED, seconds)

    def phase(self, stage: str, name: str, seconds: float) -> None:
        with self.ready:
            self.steps.append((stage, name, seconds))

    def _put(self, item: AudioEvent | Reply) -> None:
        with self.ready:
            self.items.append(item)
            self.ready.notify()

    def close(self) -> None:
        """Send what is here, then stop."""
        with self.ready:
            self.closed = True
            self.ready.notify()
        self.thread.join()

    def _send_all(self) -> None:
        """The sender's loop. Should it fail, nothing this process makes would reach the
        server again while the process lived on, silent: it ends at once instead, and the
        server sees the engine down."""
        try:
            self._send_until_closed()
        except Exception:  # noqa: BLE001 (made fatal and logged, not swallowed)
            log.exception("the engine process's sender failed: ending the engine process")
            os._exit(SENDER_FAILED)

    def _send_until_closed(self) -> None:
        while True:
            with self.ready:
                self.ready.wait_for(lambda: self.items or self.closed)
                items, steps, closed = self.items, self.steps, self.closed
                self.items, self.steps = [], []
            try:
                for message in messages(items, steps, self._snapshot(items)):
                    send(self.conn, message)
            except (OSError, ValueError):  # the server's end is gone: nothing to tell it
                return
            if closed:
                return

    def _snapshot(self, items: list[AudioEvent | Reply]) -> PipelineStats | None:
        """The gauges to push with these items, if events are among them and the last push
        is `STATS_EVERY_S` old."""
        now = time.monotonic()
        if now - self.stats_at < STATS_EVERY_S or not any(isinstance(i, AudioEvent) for i in items):
            return None
        self.stats_at = now
        return self.stats()


def messages(
    items: list[AudioEvent | Reply],
    steps: list[tuple[str, str, float]],
    stats: PipelineStats | None = None,
) -> list[FromEngine]:
    """Runs of events as one message each, replies between them where they came; the step
    times and the stats ride with the last run."""
    out: list[FromEngine] = []
    run: list[AudioEvent] = []
    for item in items:
        if isinstance(item, AudioEvent):
            run.append(item)
            continue
        if run:
            out.append(pack(run))
            run = []
        out.append(item)
    if run or steps or stats is not None:
        out.append(pack(run, steps, stats))
    return out


def child_main(graph: StageGraph, conn: Connection, lifeline: Connection, log_level: str) -> None:
    """Build the pipeline, say so (or why not), then serve calls until told to stop or the
    server's end closes; the server's process gone, at any point, ends this one."""
    # Ctrl-C and a SIGTERM sent to the whole process group (systemd, a terminal) are the
    # server's to handle: it ends its requests, then this process (the pipe's end)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    setup_logging(log_level)
    watch = threading.Thread(target=watch_server, args=(lifeline,), name="server-watch")
    watch.daemon = True
    watch.start()
    from omniflow.build.pipeline import build_pipeline

    try:
        pipeline = build_pipeline(dataclasses.replace(graph, runtime="in_process"))
    except (ValueError, RuntimeError, OSError, torch.OutOfMemoryError) as exc:
        conn.send(Reply(-1, failure=Failure.of(exc)))
        return
    conn.send(Ready(pipeline.info(), pipeline.reference_encoder() is not None))
    outbox = Outbox(conn, pipeline.stats)
    calls = Calls(pipeline, outbox)
    try:
        while not calls.stopped:
            try:
                message: ToEngine = conn.recv()
            except (EOFError, OSError):  # the server's process is gone
                log.warning("the server's process is gone: stopping the engine")
                pipeline.stop()
                break
            calls.run(message)
    finally:
        outbox.close()


def watch_server(lifeline: Connection) -> None:
    """Wait for the end of the server's process (its end of `lifeline`, never written to,
    closes with it), then end this one: an engine whose server is gone serves no one, and a
    build (minutes on a GPU) would otherwise run to its end first. `recv_bytes` returning at
    all means that end; the log line gets a second at most (a stderr nobody reads could
    block it), the exit does not wait for more."""
    try:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv_bytes()
    finally:
        say = threading.Thread(target=log.warning, args=(GONE,), daemon=True)
        say.start()
        say.join(timeout=1.0)
        os._exit(SERVER_GONE)


class Calls:
    """The server's calls, run on the pipeline in the order they came; reference encodes
    (tens of ms to seconds of CPU) on threads of their own, so that nothing else waits."""

    def __init__(self, pipeline: Orchestrator, outbox: Outbox) -> None:
        self.pipeline = pipeline
        self.outbox = outbox
        self.stopped = False
        self.encoders = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="engine-encode")
        self.trim = IdleRelease(malloc_trim(), IDLE_TRIM_S)
        """This process's free heap back to the system once its requests go idle, as the
        server does for its own process."""
        self.handlers: dict[type, Callable[..., object]] = {
            Submit: self.submit,
            Abort: lambda m: pipeline.abort(m.request_id, m.error),
            Encode: self.encode,
            Control: self.control,
        }

    def run(self, message: ToEngine) -> None:
        if isinstance(message, Took):  # no reply: the hot path of flow control
            self.pipeline.consumed(message.request_id, message.samples)
        elif isinstance(message, ExtendInput):  # errors end the request with an event
            self.pipeline.extend(message.request_id, message.text, message.done)
        elif isinstance(message, Encode):
            self.encoders.submit(self.answer, message)
        else:
            self.answer(message)

    def answer(self, message: Submit | Abort | Encode | Control) -> None:
        """Run the call and reply with its value or with what it raised."""
        try:
            value = self.handlers[type(message)](message)
        except Exception as exc:  # noqa: BLE001 (relayed: the caller raises it, as in-process)
            self.outbox.reply(Reply(message.call, failure=Failure.of(exc)))
            return
        self.outbox.reply(Reply(message.call, value))

    def submit(self, message: Submit) -> None:
        self.trim.busy()
        accepted = False
        try:
            self.pipeline.submit(message.speech, self.event, message.limits)
            accepted = True
        finally:
            if not accepted:  # refused before anything was queued: no event will end it
                self.trim.idle()

    def event(self, ev: AudioEvent) -> None:
        """Every request's sink: to the server, and a terminal event ends its run here."""
        self.outbox.event(ev)
        if ev.finished:
            self.trim.idle()

    def encode(self, message: Encode) -> object:
        """A reference encode (its activations, up to ~100 MB for a long one) counts as a
        request for the idle trim: the free heap goes back once the last of them ends."""
        encoder = self.pipeline.reference_encoder()
        if encoder is None:
            raise ValueError("this model has no reference encoders")
        self.trim.busy()
        try:
            return encoder.encode(torch.from_numpy(np.asarray(message.audio, dtype=np.float32)))
        finally:
            self.trim.idle()

    def control(self, message: Control) -> object:
        if message.name == "stats":
            return self.pipeline.stats()
        if message.name == "start":
            self.pipeline.start()
            gc.collect()  # the build's garbage, then a heap the collector no longer walks
            gc.freeze()
        elif message.name == "observe_steps":
            self.pipeline.set_step_observer(self.outbox.step)
        elif message.name == "time_phases":
            self.pipeline.set_phase_timer(PhaseClock(self.outbox.phase))
        elif message.name == "untime_phases":
            self.pipeline.set_phase_timer(NoTimer())
        elif message.name == "stop":
            self.stopped = True  # even if stopping fails: the call loop ends, so does this process
            self.encoders.shutdown(wait=True)
            self.pipeline.stop()
        return None


class PhaseClock:
    """Every step phase timed on this process's host clock, the seconds handed to
    `record` (the outbox: they go to the server's `PhaseRecord`, which keeps what it times)."""

    def __init__(self, record: Callable[[str, str, float], None]) -> None:
        self.record = record

    @contextmanager
    def phase(self, stage: str, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record(stage, name, time.perf_counter() - t0)
