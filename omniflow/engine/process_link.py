"""The server's end of the pipe to the engine process (`pipeline.runtime: process`): the
process itself, calls and their replies, each request's sink, and the process's death.

One reader thread takes everything the engine process sends, in order: events go to their
requests' sinks, step times to the step observer, stats snapshots to `snapshot`, replies to
the callers waiting on them. If the process dies (or stops answering a call), every request
in flight ends with one error event and waiting callers get `PipelineUnavailable`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from omniflow.config.graph import StageGraph
from omniflow.core.events import AudioEvent, Sink
from omniflow.core.pipeline import PipelineStats, PipelineUnavailable
from omniflow.engine.process_child import child_main
from omniflow.engine.process_wire import (
    OBSERVED,
    Abort,
    Control,
    ControlName,
    Encode,
    Events,
    FromEngine,
    Ready,
    Reply,
    Submit,
    ToEngine,
    receive,
    unpack,
)

log = logging.getLogger(__name__)

STOP_WAIT_S = 60.0
"""How long a stop waits for the engine process to end its requests and exit before it is
killed."""
CALL_WAIT_S = 60.0
"""How long a call waits for its reply: an engine process that answers nothing in that long
is taken as down (a hung device call), rather than holding the server's callers forever."""

Call = Submit | Abort | Encode | Control


class NoAnswer(PipelineUnavailable):
    """The engine process answered nothing within its wait."""


class EngineLink:
    """The engine process, built on construction (its build's failure raised here)."""

    def __init__(self, graph: StageGraph) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state forked
        self.conn, child_end = ctx.Pipe()
        # written to never: the engine process watches it from the start, so that this
        # process's end (even a SIGKILL during the build, when nothing reads the pipe yet)
        # ends the engine's; closed once the engine process has ended (_end_process)
        lifeline, self._lifeline = ctx.Pipe(duplex=False)
        level = logging.getLevelName(logging.getLogger("omniflow").getEffectiveLevel())
        self.process = ctx.Process(
            target=child_main, args=(graph, child_end, lifeline, level), name="omniflow-engine"
        )
        self.process.start()
        child_end.close()  # ours is closed: the reader sees EOF when the child's end goes
        lifeline.close()
        log.info("building the pipeline in engine process %d", self.process.pid)
        built = False
        try:
            self.ready = self._first_message()
            built = True
        finally:  # a failed build, or Ctrl-C while waiting for one: no engine left behind
            if not built:
                self.process.kill()
                self.process.join()
                self._lifeline.close()
        self.sinks: dict[str, Sink] = {}
        self.submitting: set[str] = set()
        """Requests whose `submit` waits for its reply: if the process dies meanwhile, the
        submit raises and their sink gets nothing (one of the two, never both)."""
        self.observer: Callable[[str, float], None] | None = None
        self.phases: Callable[[str, str, float], None] | None = None
        """Where step phases timed in the engine process go (`time_phases`)."""
        self.snapshot: tuple[float, PipelineStats] | None = None
        """The latest stats the process pushed with its events, and when they came."""
        self.death: str | None = None
        self.stopping = False
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._calls = itertools.count()
        self._waiting: dict[int, Future] = {}
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._reader.start()

    def _first_message(self) -> Ready:
        try:
            first: FromEngine = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=STOP_WAIT_S)
            raise RuntimeError(
                f"the engine process exited (code {self.process.exitcode}) while building "
                "the pipeline; its log above says why"
            ) from None
        if isinstance(first, Reply) and first.failure is not None:
            raise first.failure.error()
        assert isinstance(first, Ready), first
        return first

    # ------------------------------------------------------------------ requests

    def begin(self, request_id: str, sink: Sink) -> None:
        """Register a request's sink before its `Submit` goes (its first events may come
        before the reply); a running id is refused."""
        with self._lock:
            if request_id in self.sinks:
                raise ValueError(f"request id {request_id!r} is already running")
            self.sinks[request_id] = sink
            self.submitting.add(request_id)

    def begun(self, request_id: str, accepted: bool) -> None:
        """Its `Submit` answered: a refused request's sink goes. An accepted one whose engine
        died since (its sink skipped by `_died`) is raised as unavailable, not left waiting."""
        with self._lock:
            self.submitting.discard(request_id)
            if not accepted or self.death is not None:
                self.sinks.pop(request_id, None)
            death = self.death if accepted else None
        if death is not None:
            raise PipelineUnavailable(death)

    # ------------------------------------------------------------------ calls

    def next_call(self) -> int:
        return next(self._calls)

    @property
    def on_reader(self) -> bool:
        """Whether this is the reader thread (a sink or the step observer calling back)."""
        return threading.current_thread() is self._reader

    def call(self, message: Call, wait_s: float | None = None) -> object:
        """Send `message` and wait for its reply (`CALL_WAIT_S` unless said); its failure
        raised here. No reply in time: the engine process is taken as down (killed: its
        requests end, waiting calls fail) and `NoAnswer` raised."""
        wait_s = CALL_WAIT_S if wait_s is None else wait_s
        if self.on_reader:  # its reply could only come through this very thread
            raise RuntimeError("a sink cannot wait for the engine process: only abort it")
        future: Future = Future()
        with self._lock:
            if self.death is not None:
                raise PipelineUnavailable(self.death)
            self._waiting[message.call] = future
        self.send(message)
        try:
            reply: Reply = future.result(wait_s)
        except FutureTimeout:
            with self._lock:
                self._waiting.pop(message.call, None)
            log.error("the engine process answered nothing in %g s: killing it", wait_s)
            self.process.kill()  # the reader sees the pipe's end and ends every request
            raise NoAnswer(
                f"the engine process answered nothing in {wait_s:g} s; the pipeline is down"
            ) from None
        if reply.failure is not None:
            raise reply.failure.error()
        return reply.value

    def control(self, name: ControlName, wait_s: float | None = None) -> object:
        """A `Control` call (`call`)."""
        return self.call(Control(self.next_call(), name), wait_s)

    def send(self, message: ToEngine) -> None:
        """One message down the pipe; a closed pipe is the reader's to report."""
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self.conn.send(message)

    # ------------------------------------------------------------------ the reader

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = receive(self.conn)
                except (EOFError, OSError):
                    return
                if isinstance(message, Events):
                    self._deliver(message)
                elif isinstance(message, Reply):
                    with self._lock:
                        future = self._waiting.pop(message.call, None)
                    if future is not None:
                        future.set_result(message)
        finally:  # the end of the pipe, or a sink that raised: the pipeline is down either way
            self._died()

    def _deliver(self, message: Events) -> None:
        if message.stats is not None:
            self.snapshot = (time.monotonic(), message.stats)
        for ev in unpack(message):
            with self._lock:
                pop = self.sinks.pop if ev.finished else self.sinks.get
                sink = pop(ev.request_id, None)
            if sink is not None:
                sink(ev)
        observer, phases = self.observer, self.phases
        for stage, name, seconds in message.steps:
            if name == OBSERVED and observer is not None:
                observer(stage, seconds)
            elif name != OBSERVED and phases is not None:
                phases(stage, name, seconds)

    def _died(self) -> None:
        if not self.stopping and self.process.is_alive():  # the reader ended, not the engine
            self.process.kill()  # (a sink raised): no engine left running without a reader
        self.process.join(timeout=STOP_WAIT_S)
        if self.stopping:
            why = "the pipeline stopped"
        else:
            why = f"the engine process exited (code {self.process.exitcode}); the pipeline is down"
        with self._lock:
            self.death = why
            ended = {r: s for r, s in self.sinks.items() if r not in self.submitting}
            self.sinks = {}
            waiting, self._waiting = self._waiting, {}
        if not self.stopping:
            log.error("%s: ending %d request(s)", why, len(ended))
        for rid, sink in ended.items():
            sink(AudioEvent(rid, finished=True, finish_reason="error", error=why))
        for future in waiting.values():
            future.set_exception(PipelineUnavailable(why))

    # ------------------------------------------------------------------ the end

    def stop(self) -> None:
        """End the engine's requests and its process (killed past `STOP_WAIT_S`)."""
        left, self.stopping = self.stopping, True  # after leave() the pipe is shut already
        try:
            if not left and self.death is None and not self.on_reader:
                self.control("stop", STOP_WAIT_S)
        except NoAnswer:
            log.warning("the engine process did not stop in time: killed")
        except RuntimeError as exc:  # its stop failed there, or it died meanwhile
            if self.death is None:
                log.warning("the engine process's stop failed: %s", exc)
        finally:  # whatever the call said, the process ends here
            self._end_process()
            if not self.on_reader:
                self._reader.join(timeout=STOP_WAIT_S)
            self.conn.close()

    def leave(self) -> None:
        """The interpreter is exiting without `stop()`: the pipe is shut (both ends see its
        end: closing it alone would not wake a reader blocked on it), the engine stops on
        that, and it is waited for, so multiprocessing's own exit join does not hang."""
        self.stopping = True
        if self.death is None:  # told first, so it stops as told, then sees the pipe's end
            self.send(Control(self.next_call(), "stop"))
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        self._end_process()

    def _end_process(self) -> None:
        self.process.join(timeout=STOP_WAIT_S)
        if self.process.is_alive():  # SIGKILL: the engine process ignores SIGTERM
            self.process.kill()
            self.process.join()
        self._lifeline.close()
