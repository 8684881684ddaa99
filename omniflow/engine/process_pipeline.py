"""`pipeline.runtime: process`: the pipeline runs in a process of its own and this object
stands in for it, answering the `Pipeline` protocol (`core/pipeline.py`) through the pipe
(`engine/process_link.py`).

Why: in-process, the server's event loop and the engine's threads take turns on one
interpreter lock, and at high concurrency the HTTP side's share of it is time the GPU waits
(docs/performance.md). Here the engine's process has its own lock; this process keeps HTTP.

`stats()` is read on the event loop at every admission: while requests run it answers from
the snapshot the engine process pushes with its events (at most `STATS_FRESH_S` old),
otherwise with a call (exact when idle, as a benchmark reads its counters after a round);
`in_flight` is counted here, exactly. A dead engine process reads as
every stage down (503), as a dead stage loop does in-process.
"""

from __future__ import annotations

import atexit
import dataclasses
import time
from collections.abc import Callable

import numpy as np
import torch

from omniflow.config.graph import StageGraph
from omniflow.core.events import Sink
from omniflow.core.pipeline import (
    UNBOUNDED,
    NoTimer,
    PhaseRecord,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    RequestLimits,
    StageStats,
)
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import EncodedVoice
from omniflow.engine.messages import ExtendInput
from omniflow.engine.process_link import EngineLink
from omniflow.engine.process_wire import Abort, Encode, Submit
from omniflow.engine.routing import Took

STATS_FRESH_S = 0.1
"""How old a pushed stats snapshot may be and still answer `stats()`."""


class ProcessPipeline:
    """The server's side of a pipeline in its own process (built there on construction)."""

    def __init__(self, graph: StageGraph) -> None:
        self._link = EngineLink(graph)
        self._info = dataclasses.replace(self._link.ready.info, engine_pid=self.pid)
        self._last_stats: PipelineStats | None = None
        self._stopped = False
        # An interpreter leaving without stop() shuts the pipe, so the engine stops and
        # multiprocessing's exit hook (registered earlier, so run later) can join it.
        atexit.register(self._link.leave)

    @property
    def pid(self) -> int | None:
        """The engine process's id (operators: its logs, `py-spy`)."""
        return self._link.process.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs; 0 after a clean `stop()`; minus a signal's number if killed."""
        return self._link.process.exitcode

    # ------------------------------------------------------------------ the protocol

    def info(self) -> PipelineInfo:
        return self._info

    def stats(self) -> PipelineStats:
        link = self._link
        if link.death is None:
            pushed = link.snapshot
            busy = bool(link.sinks)  # idle: a call (cheap then), exact for whoever reads next
            if busy and pushed is not None and time.monotonic() - pushed[0] < STATS_FRESH_S:
                stats = pushed[1]
            else:
                try:
                    stats = link.control("stats")
                except PipelineUnavailable:
                    return self._down()
                assert isinstance(stats, PipelineStats)
            self._last_stats = stats
            return dataclasses.replace(stats, in_flight=len(link.sinks))
        return self._down()

    def _down(self) -> PipelineStats:
        """The stages' last gauges, every one of them down."""
        last = self._last_stats.stages if self._last_stats is not None else ()
        stages = tuple(dataclasses.replace(s, alive=False) for s in last) or tuple(
            StageStats(name=n, alive=False, running=0, waiting=0) for n in self._info.stages
        )
        return PipelineStats(len(self._link.sinks), stages)

    def reference_encoder(self) -> RemoteEncoder | None:
        return RemoteEncoder(self._link) if self._link.ready.clones else None

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None:
        self._link.observer = observer
        self._link.control("observe_steps")

    def set_phase_timer(self, timer: PhaseRecord) -> None:
        """Step phases timed in the engine process on its host clock, their seconds handed
        to `timer.add` (a device-synchronised timing cannot reach that process's device
        from here: `bench.phase_timing=device` is refused with this runtime)."""
        untimed = isinstance(timer, NoTimer)
        self._link.phases = None if untimed else timer.add
        if untimed and self._link.death is not None:
            return  # a dead engine times nothing (and a caller's cleanup must not raise)
        self._link.control("untime_phases" if untimed else "time_phases")

    def submit(self, speech: SpeechRequest, sink: Sink, limits: RequestLimits = UNBOUNDED) -> None:
        link, rid = self._link, speech.request_id
        link.begin(rid, sink)
        accepted = False
        try:
            link.call(Submit(link.next_call(), speech, limits))
            accepted = True
        finally:
            link.begun(rid, accepted)

    def consumed(self, request_id: str, samples: int) -> None:
        if self._link.death is None:
            self._link.send(Took(request_id, samples))

    def abort(self, request_id: str, error: str | None = None) -> None:
        """Returns once the request's terminal event reached its sink (the reply comes after
        it); from a sink, at once (its terminal event follows when the sink returns); a dead
        engine's requests already had theirs."""
        link = self._link
        message = Abort(link.next_call(), request_id, error)
        if link.on_reader:
            link.send(message)
            return
        try:
            link.call(message)
        except PipelineUnavailable:
            return

    def extend(self, request_id: str, text: str, done: bool) -> None:
        if self._link.death is None:
            self._link.send(ExtendInput(request_id, text, done))

    def start(self) -> None:
        self._link.control("start")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self._link.leave)
        self._link.stop()


@dataclasses.dataclass(frozen=True)
class RemoteEncoder:
    """The model's reference encoders, in the engine's process (`ReferenceEncoder`): a
    recording is encoded there."""

    link: EngineLink

    def encode(self, audio: torch.Tensor) -> EncodedVoice:
        samples = np.ascontiguousarray(audio.detach().to("cpu", torch.float32).numpy())
        return self.link.call(Encode(self.link.next_call(), samples))  # type: ignore[return-value]
