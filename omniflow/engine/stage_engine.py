"""A stage's engine thread: its inbox of typed messages, its death, its periodic log line.

`StageEngine` runs a `StepLoop` (`engine/step_loop.py`) on a thread (the embedded, in-process
runtime): work arrives as typed messages (`engine/messages.py`) through a thread-safe queue
and is applied on the engine thread; outputs leave through the `on_output` callback. A stage
in a Ray actor (`pipeline.runtime: ray`) runs this same engine there, and the orchestrator
drives it through `deploy/remote_stage.py`, another `StageHandle` (`engine/handles.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from omniflow.core.output import StageOutput
from omniflow.core.pipeline import SchedulerGauges
from omniflow.engine.contracts import Runner, Scheduler
from omniflow.engine.messages import Abort, Add, EngineMessage
from omniflow.engine.step_loop import StepLoop

log = logging.getLogger(__name__)

OutputSink = Callable[[StageOutput], None]

STATS_INTERVAL_S = 10.0
"""How often a busy engine logs one INFO line of throughput and queue state."""

IDLE_WAIT_S = 0.02
"""How long the loop waits for input when requests exist but nothing could be scheduled
(e.g. a code2wav request waiting for its next chunk); deadlines are checked at this pace."""


def gauge_line(g: SchedulerGauges) -> str:
    """The scheduler's gauges as `key=value` words for the log line (unset ones left out)."""
    fields = dataclasses.asdict(g)
    windows = fields.pop("windows")
    words = [f"{k}={v}" for k, v in fields.items() if v is not None]
    if windows is not None:
        words += [f"windows_{k}={v}" for k, v in windows.items() if not isinstance(v, dict)]
    return " ".join(words)


class StageEngine(StepLoop):
    """A step loop on its own thread, fed by messages."""

    def __init__(self, name: str, scheduler: Scheduler, runner: Runner, **options: Any) -> None:
        """`options` as `StepLoop` takes them; `on_output` is set by whoever consumes the
        outputs (the orchestrator) before `start`."""
        super().__init__(name, scheduler, runner, **options)
        self.on_output: OutputSink | None = None
        self._inbox: queue.Queue[EngineMessage | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._dead = threading.Event()
        """Set when the loop died: the stage takes no more work."""
        self._send_lock = threading.Lock()
        self._death: str | None = None
        self.step_observer: Callable[[float], None] | None = None
        """Called with each productive step's duration in seconds (metrics)."""
        self._stats_at = time.monotonic()
        self._stats_steps = 0
        self._stats_outputs = 0

    @property
    def alive(self) -> bool:
        """False once the engine loop has died (its requests have each had one error)."""
        return not self._dead.is_set()

    def submit(self, request: Any, initial_chunk_frames: int | None = None) -> None:
        """Thread-safe admission (applied on the engine thread)."""
        self.send(Add(request, initial_chunk_frames))

    # ------------------------------------------------------------------ threaded API

    def send(self, message: EngineMessage) -> None:
        """Queue a message for the engine thread (thread-safe). Once the loop has died, a
        request sent here ends at once with one error instead of waiting forever."""
        with self._send_lock:
            if not self._dead.is_set():
                self._inbox.put(message)
                if isinstance(message, Add) and self.scheduler.seats_free():
                    self.arrivals.notify()  # a running window ends at its next step
                return
        self._emit(self._refuse(message))

    def abort(self, request_id: str) -> None:
        self.send(Abort(request_id))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.close()

    def send_early(self, outputs: list[StageOutput]) -> None:
        """A window's chunk audio, sent as soon as it is made; with no consumer yet (a loop
        stepped by its caller) kept for the step's outputs."""
        if self.on_output is None:
            super().send_early(outputs)
        else:
            self._emit(outputs)

    def _emit(self, outputs: list[StageOutput]) -> None:
        for out in outputs:
            if out.finished and self.intake is not None:
                self.intake.close(out.request_id)  # ended here: no more chunks to cut
            if self.on_output is not None:
                self.on_output(out)

    def _drain(self, timeout: float | None) -> None:
        """Apply queued commands and emit their outputs (`_take`)."""
        self._emit(self._take(timeout))

    def take_arrivals(self) -> list[StageOutput]:
        """`_take` within a step (`StepLoop.take_arrivals`): the outputs are returned with
        the step's, after them."""
        return self._take(0)

    def _take(self, timeout: float | None) -> list[StageOutput]:
        """Apply queued commands; wait up to `timeout` for the first (None: forever). The
        arrivals flag is cleared first: what it announced is applied here, and an arrival
        after this sets it again. Raised again when an arrival was applied, a window is in
        flight (under async scheduling, submitted and perhaps not yet run) and a waiting
        request could be seated: the step seating it runs after that window, which must
        still end at its next step boundary; not for an arrival refused, aborted or paused
        at once, nor without a window in flight (sync scheduling: the next plan seats it).
        The stop sentinel ends it (the loop then sees `_stopping`)."""
        self.arrivals.clear()
        outputs: list[StageOutput] = []
        try:
            item = self._inbox.get(timeout=timeout) if timeout != 0 else self._inbox.get_nowait()
        except queue.Empty:
            return outputs
        arrived = False
        while item is not None:
            arrived = arrived or isinstance(item, Add)
            outputs += self.apply(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        if arrived and self.window_in_flight and self.scheduler.seatable():
            self.arrivals.notify()
        return outputs

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._drain(timeout=0 if self.has_work else None)
                if self._stopping.is_set():
                    break
                if self.has_work:
                    t0 = time.perf_counter()
                    outputs = self.step()
                    if self._progressed and self.step_observer is not None:
                        self.step_observer(time.perf_counter() - t0)
                    self._emit(outputs)
                    self._log_stats(outputs)
                    if not self._progressed:
                        self._drain(timeout=IDLE_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the loop is dying: end every request once
            # Any escape here is a bug, not a request's failure (the runner turns model errors
            # into per-request errors). Each request still gets exactly one error output, and
            # `abort_request` releases its scheduler state (KV blocks, queues); queued
            # admissions are refused and later sends are answered at once (see `send`).
            log.exception("stage %s: engine loop failed", self.name)
            self._death = f"stage {self.name} failed: {exc}"
            with self._send_lock:
                self._dead.set()
            self._fail_all(self._death)
            self._refuse_pending()

    def _log_stats(self, outputs: list[StageOutput]) -> None:
        if self._progressed:
            self._stats_steps += 1
            self._stats_outputs += sum(len(o.tokens) or (o.audio is not None) for o in outputs)
        now = time.monotonic()
        if now - self._stats_at < STATS_INTERVAL_S:
            return
        if self._stats_steps:
            span = now - self._stats_at
            gauges = gauge_line(self.scheduler.gauges())
            log.info(
                "stage %s: %.1f steps/s, %.1f outputs/s, %s",
                self.name,
                self._stats_steps / span,
                self._stats_outputs / span,
                gauges,
            )
        self._stats_at, self._stats_steps, self._stats_outputs = now, 0, 0

    def _refuse(self, message: EngineMessage) -> list[StageOutput]:
        """A dead stage answers an admission with one error; other messages are moot."""
        if isinstance(message, Add):
            error = self._death or f"stage {self.name} is not running"
            rid = message.request.request_id
            return [StageOutput(rid, finished=True, finish_reason="error", error=error)]
        return []

    def _refuse_pending(self) -> None:
        """Messages queued before the loop died are never applied: refuse them now."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._emit(self._refuse(item))

    def _fail_all(self, message: str) -> None:
        for rid in self.scheduler.unfinished_ids():
            self._emit(self.abort_request(rid, "error", message))
        ended = {o.request_id for o in self._unsent if o.finished}
        self._unsent = []
        for rid in ended:  # ended by an update whose outputs the dying step never returned
            self._emit([StageOutput(rid, finished=True, finish_reason="error", error=message)])
