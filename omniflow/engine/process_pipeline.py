"""`pipeline.runtime: process`: the pipeline runs in a process of its own and this object
stands in for it, answering the `Pipeline` protocol (`core/pipeline.py`) over one pipe.

Why: in-process, the server's event loop and the engine's threads take turns on one
interpreter lock, and at high concurrency the HTTP side's share of it is time the GPU waits
(docs/performance.md). Here the engine's process has its own lock; this process keeps HTTP.

One reader thread takes everything the engine's process sends, in order: events go to their
requests' sinks (each request's PCM a view of its message's one array), step times to the
step observer, replies to the callers waiting on them. If that process dies, every request
in flight ends with an error event, waiting callers get `PipelineUnavailable`, `stats()`
says every stage is down and new requests are refused (HTTP 503), as when a stage's loop
dies in-process.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

from omniflow.config.graph import StageGraph
from omniflow.core.events import AudioEvent, Sink
from omniflow.core.pipeline import (
    UNBOUNDED,
    NoTimer,
    PhaseTimer,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    RequestLimits,
    StageStats,
)
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import EncodedVoice
from omniflow.engine.process_child import child_main
from omniflow.engine.process_wire import (
    Abort,
    Consumed,
    Control,
    Encode,
    Events,
    Extend,
    FromEngine,
    Ready,
    Reply,
    Submit,
    ToEngine,
    unpack,
)

log = logging.getLogger(__name__)

STOP_WAIT_S = 60.0
"""How long `stop()` waits for the engine's process to end its requests and exit before it
is terminated."""


class ProcessPipeline:
    """The server's side of a pipeline in its own process (built there on construction)."""

    def __init__(self, graph: StageGraph) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state forked
        self._conn, child_end = ctx.Pipe()
        level = logging.getLevelName(logging.getLogger("omniflow").getEffectiveLevel())
        self._process = ctx.Process(
            target=child_main, args=(graph, child_end, level), name="omniflow-engine"
        )
        self._process.start()
        child_end.close()  # ours is closed: the reader sees EOF when the child's end goes
        log.info("building the pipeline in engine process %d", self._process.pid)
        built = False
        try:
            first = self._first_message()
            built = True
        finally:  # a failed build, or Ctrl-C while waiting for one: no engine left behind
            if not built:
                self._process.terminate()
                self._process.join()
        self._info: PipelineInfo = first.info
        self._clones = first.clones
        self._stages = first.info.stages
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._calls = itertools.count()
        self._waiting: dict[int, Future] = {}
        self._sinks: dict[str, Sink] = {}
        self._observer: Callable[[str, float], None] | None = None
        self._death: str | None = None
        self._last_stats = PipelineStats(0, ())
        self._stopped = False
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._reader.start()
        # An interpreter leaving without stop() closes the pipe first, so the engine stops
        # and multiprocessing's exit hook (registered earlier, so run later) can join it.
        atexit.register(self._conn.close)

    def _first_message(self) -> Ready:
        """`Ready`, or the build's failure raised here; a process that died without a word
        is a RuntimeError naming its exit code."""
        try:
            first: FromEngine = self._conn.recv()
        except (EOFError, OSError):
            self._process.join()
            raise RuntimeError(
                f"the engine process exited (code {self._process.exitcode}) while building "
                "the pipeline; its log above says why"
            ) from None
        if isinstance(first, Reply) and first.failure is not None:
            self._process.join()
            raise first.failure.error()
        assert isinstance(first, Ready), first
        return first

    @property
    def pid(self) -> int | None:
        """The engine process's id (operators: its logs, `py-spy`)."""
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs; 0 after a clean `stop()`; minus a signal's number if killed."""
        return self._process.exitcode

    # ------------------------------------------------------------------ the protocol

    def info(self) -> PipelineInfo:
        return self._info

    def stats(self) -> PipelineStats:
        if self._death is not None:  # the stages' last gauges, every one of them down
            down = tuple(dataclasses.replace(s, alive=False) for s in self._last_stats.stages)
            return PipelineStats(len(self._sinks), down or self._down_stages())
        stats = self._call(Control(self._next(), "stats"))
        assert isinstance(stats, PipelineStats)
        self._last_stats = stats
        return stats

    def _down_stages(self) -> tuple[StageStats, ...]:
        return tuple(StageStats(name=n, alive=False, running=0, waiting=0) for n in self._stages)

    def reference_encoder(self) -> RemoteEncoder | None:
        return RemoteEncoder(self) if self._clones else None

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None:
        self._observer = observer
        self._call(Control(self._next(), "observe_steps"))

    def set_phase_timer(self, timer: PhaseTimer) -> None:
        """Step phases are timed in-process only: refused here (none is the default)."""
        if not isinstance(timer, NoTimer):
            raise ValueError(
                "pipeline.runtime=process: the engine runs in another process, whose step "
                "phases are not timed here; use pipeline.runtime=in_process to time them"
            )

    def submit(self, speech: SpeechRequest, sink: Sink, limits: RequestLimits = UNBOUNDED) -> None:
        rid = speech.request_id
        with self._lock:
            if rid in self._sinks:
                raise ValueError(f"request id {rid!r} is already running")
            self._sinks[rid] = sink  # before the call: its first events may come before the reply
        try:
            self._call(Submit(self._next(), speech, limits))
        except (ValueError, RuntimeError):
            with self._lock:
                self._sinks.pop(rid, None)
            raise

    def consumed(self, request_id: str, samples: int) -> None:
        self._send(Consumed(request_id, samples))

    def abort(self, request_id: str, error: str | None = None) -> None:
        """Returns once the request's terminal event reached its sink (the reply comes after
        it); a dead engine's requests already had theirs."""
        with contextlib.suppress(PipelineUnavailable):
            self._call(Abort(self._next(), request_id, error))

    def extend(self, request_id: str, text: str, done: bool) -> None:
        self._send(Extend(request_id, text, done))

    def encode(self, audio: torch.Tensor) -> EncodedVoice:
        """A reference recording encoded by the engine's process (its encoders live there)."""
        samples = audio.detach().to("cpu", torch.float32).numpy()
        voice = self._call(Encode(self._next(), np.ascontiguousarray(samples)))
        return voice  # type: ignore[return-value]  # the encoders' EncodedVoice

    def start(self) -> None:
        self._call(Control(self._next(), "start"))

    def stop(self) -> None:
        """End the engine's requests and its process (terminated past `STOP_WAIT_S`)."""
        if self._stopped:
            return
        self._stopped = True
        if self._death is None:
            try:
                self._call(Control(self._next(), "stop"), timeout_s=STOP_WAIT_S)
            except (PipelineUnavailable, TimeoutError):
                log.warning("the engine process did not stop in time: terminating it")
        self._process.join(timeout=STOP_WAIT_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._conn.close()
        atexit.unregister(self._conn.close)
        self._reader.join(timeout=STOP_WAIT_S)

    # ------------------------------------------------------------------ the pipe

    def _next(self) -> int:
        return next(self._calls)

    def _send(self, message: ToEngine) -> None:
        if self._death is None:  # to a dead engine: nothing (its requests already ended)
            self._write(message)

    def _write(self, message: ToEngine) -> None:
        """One message down the pipe; a closed pipe is the reader's to report (it fails the
        waiting calls and ends the requests)."""
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self._conn.send(message)

    def _call(self, message: Submit | Abort | Encode | Control, timeout_s: float | None = None):
        future: Future = Future()
        with self._lock:
            if self._death is not None:
                raise PipelineUnavailable(self._death)
            self._waiting[message.call] = future
        self._write(message)
        reply: Reply = future.result(timeout_s)
        if reply.failure is not None:
            raise reply.failure.error()
        return reply.value

    def _read(self) -> None:
        while True:
            try:
                message: FromEngine = self._conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Events):
                self._deliver(message)
            elif isinstance(message, Reply):
                with self._lock:
                    future = self._waiting.pop(message.call, None)
                if future is not None:
                    future.set_result(message)
        self._died()

    def _deliver(self, message: Events) -> None:
        for ev in unpack(message):
            with self._lock:
                pop = self._sinks.pop if ev.finished else self._sinks.get
                sink = pop(ev.request_id, None)
            if sink is not None:
                sink(ev)
        observer = self._observer
        if observer is not None:
            for stage, seconds in message.steps:
                observer(stage, seconds)

    def _died(self) -> None:
        """The pipe closed: after `stop()`, the end; otherwise the engine's process died."""
        self._process.join(timeout=STOP_WAIT_S)
        code = self._process.exitcode
        why = f"the engine process exited (code {code}); the pipeline is down"
        with self._lock:
            self._death = why
            sinks, self._sinks = self._sinks, {}
            waiting, self._waiting = self._waiting, {}
        if not self._stopped:
            log.error("%s: ending %d request(s)", why, len(sinks))
        for rid, sink in sinks.items():
            sink(AudioEvent(rid, finished=True, finish_reason="error", error=why))
        for future in waiting.values():
            future.set_exception(PipelineUnavailable(why))


@dataclasses.dataclass(frozen=True)
class RemoteEncoder:
    """The model's reference encoders, in the engine's process (`ReferenceEncoder`)."""

    pipeline: ProcessPipeline

    def encode(self, audio: torch.Tensor) -> EncodedVoice:
        return self.pipeline.encode(audio)
