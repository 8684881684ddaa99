"""The orchestrator's request state, owned by one thread: every change to it (a request
begun, ended, its audio taken, a stage's output routed) arrives as a typed message in the
router's inbox and is applied there, in arrival order. Callers on HTTP threads and engine
threads only post messages; nothing is shared under a lock, and the flow-control messages
(`engine/flow.py`) leave in the order they were decided."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from omniflow.core.events import AudioEvent, Sink
from omniflow.core.output import StageOutput
from omniflow.core.request import FinishReason
from omniflow.engine.contracts import StageEngineHandle
from omniflow.engine.flow import FlowMessage, RequestFlow
from omniflow.engine.messages import Abort, Hold, ReceiveFrames

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Begin:
    """A submitted request: its sink, and its flow control (None: none)."""

    request_id: str
    sink: Sink
    flow: RequestFlow | None


@dataclass(frozen=True)
class End:
    """End the request everywhere with `event` (an abort or an error); `origin`: the stage
    that ended it itself, which needs no Abort."""

    request_id: str
    event: AudioEvent
    origin: str | None = None


@dataclass(frozen=True)
class Applied:
    """Set once every message posted before it has been applied (a caller that must see
    its change made, e.g. an abort's terminal event delivered, waits on it)."""

    done: threading.Event


@dataclass(frozen=True)
class Took:
    """The consumer of a flow-controlled request took `samples` of its audio."""

    request_id: str
    samples: int


@dataclass(frozen=True)
class Emitted:
    """A stage's output, to route along the graph."""

    stage: str
    output: StageOutput


RouterMessage = Begin | End | Took | Emitted | Applied


@dataclass
class _Live:
    sink: Sink
    frames: int = 0
    source_reason: FinishReason | None = None
    flow: RequestFlow | None = None
    seated_at: float | None = None
    """When the source stage seated it (from its first output), for its audio events."""
    text_done_at: float | None = None
    """Live input: when the router got the source stage's output showing its end of text
    taken, and the frames made up to the step that took it."""
    text_done_frames: int = 0


@dataclass(frozen=True)
class Topology:
    """What routing needs of the graph: the source, the final stage, each stage's
    downstream, and every stage's engine (by name, in topological order)."""

    source: str
    final: str
    downstream: dict[str, str | None]
    engines: Mapping[str, StageEngineHandle]


class Router:
    """Applies `RouterMessage`s on its own thread; `post` is the only entry, from any
    thread. `live` is read elsewhere only for counts (a consistent-enough view)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.live: dict[str, _Live] = {}
        self._inbox: queue.SimpleQueue[RouterMessage | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="router", daemon=True)

    def post(self, message: RouterMessage) -> None:
        self._inbox.put(message)

    def post_and_wait(self, message: RouterMessage, timeout: float = 30.0) -> None:
        """Post `message` and return once it is applied: a single-owner handoff for a caller
        that must see its effect (inline when the router is not running, or when called
        from the router's own thread, e.g. by a sink)."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            self.apply(message)
            return
        done = threading.Event()
        self.post(message)
        self.post(Applied(done))
        if not done.wait(timeout):
            log.warning("router: a message was not applied within %.0f s", timeout)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Apply what is queued, then stop."""
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while (message := self._inbox.get()) is not None:
            self.apply(message)

    def apply(self, message: RouterMessage) -> None:
        """Apply one message now (the router's thread; tests call it inline)."""
        match message:
            case Begin(request_id=rid, sink=sink, flow=flow):
                self.live[rid] = _Live(sink, flow=flow)
            case End(request_id=rid, event=event, origin=origin):
                self._end(rid, event, origin)
            case Took(request_id=rid, samples=samples):
                live = self.live.get(rid)
                if live is not None and live.flow is not None:
                    self._send_flow(live.flow.on_consumed(samples))
            case Emitted(stage=stage, output=out):
                self._route(stage, out)
            case Applied(done=done):
                done.set()

    def _send_flow(self, messages: list[FlowMessage]) -> None:
        for stage, message in messages:
            self.topology.engines[stage].send(message)

    def _end(self, rid: str, event: AudioEvent, origin: str | None) -> None:
        live = self.live.pop(rid, None)
        if live is None:
            return
        if live.flow is not None:
            live.flow.release()
        for name, engine in self.topology.engines.items():
            if name != origin:
                engine.send(Abort(rid))
        live.sink(event)

    def _route(self, stage: str, out: StageOutput) -> None:
        rid, t = out.request_id, self.topology
        if out.error is not None:
            self._end(
                rid, AudioEvent(rid, finished=True, finish_reason="error", error=out.error), stage
            )
            return
        if out.finish_reason == "abort":
            return  # the orchestrator ended it; the sink already has its terminal event
        downstream = t.downstream[stage]
        if out.held:
            if downstream is not None:
                t.engines[downstream].send(Hold(rid))
            return
        live = self.live.get(rid)
        if live is None:
            return
        frames = tuple(f for f in out.frames if f is not None)
        audio = stage == t.final and out.audio is not None and bool(out.audio.size)
        if stage == t.source:
            live.frames += len(frames)
            live.seated_at = live.seated_at or out.seated_at
            if out.text_done_at is not None:
                # Stamped again here: a stage under Ray may run on another host, whose
                # perf_counter is not the server's (the time adds the hand-off to the router).
                later = out.frames[len(out.frames) - out.text_done_after :]
                live.text_done_at = time.perf_counter()
                live.text_done_frames = live.frames - sum(f is not None for f in later)
            live.source_reason = out.finish_reason or live.source_reason
        if live.flow is not None:
            self._send_flow(live.flow.on_used(stage, out.consumed_frames))
            if downstream is not None:
                self._send_flow(live.flow.on_sent(downstream, len(frames)))
            if audio:
                self._send_flow(live.flow.on_audio(out.audio.size))
        if downstream is not None:
            t.engines[downstream].send(ReceiveFrames(rid, frames, out.finished))
        if stage != t.final:
            return
        if audio:
            live.sink(AudioEvent(rid, pcm=out.audio, frames=live.frames, seated_at=live.seated_at))
        if out.finished:
            self.live.pop(rid, None)
            if live.flow is not None:
                live.flow.release()
            reason = live.source_reason or out.finish_reason
            live.sink(
                AudioEvent(
                    rid,
                    frames=live.frames,
                    finished=True,
                    finish_reason=reason,
                    text_done_at=live.text_done_at,
                    text_done_frames=live.text_done_frames,
                )
            )
