"""Routes speech requests through the stage graph and streams PCM out in order.

The orchestrator is the one public interface of a running pipeline: serve, synth and the
benchmarks use `submit`, `abort`, `consumed`, `info`, `stats`, `start`, `stop` (and
`reference_encoder`, a Base model's voice-clone capability) and nothing else. It
holds one engine per stage (by name, in topological order) and routes each stage's outputs
along the graph's edges: frames go to the downstream stage as typed `ReceiveFrames`
messages; the final stage's PCM goes to the request's sink. Per request it guarantees:
- PCM events arrive in order (one router thread applies every change to a request's state
  and calls its sink, `engine/routing.py`);
- exactly one terminal event (finished, error or abort), after which nothing else arrives;
- an error or abort in any stage ends the request in every stage, releasing KV blocks and
  decoder slots.
A request submitted with `max_buffered_s` is flow-controlled (`engine/flow.py`): its
consumer reports the audio it took with `consumed`, and a consumer or stage that falls
behind pauses what feeds it instead of letting buffers grow.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping

from omniflow.config.graph import StageGraph
from omniflow.core.events import AudioEvent, Sink
from omniflow.core.pipeline import (
    UNBOUNDED,
    Overloaded,
    PhaseTimer,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    RequestLimits,
)
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import ReferenceEncoder
from omniflow.engine.flow import (
    Bound,
    FlowTotals,
    RequestFlow,
    edge_bound,
    samples_per_frame,
)
from omniflow.engine.handles import StageFront, StageHandle
from omniflow.engine.messages import Add, ExtendInput
from omniflow.engine.parts import SpeechFrontend
from omniflow.engine.routing import Begin, Emitted, End, Router, Took, Topology

log = logging.getLogger(__name__)


class Orchestrator:
    """Runs a validated pipeline: one engine per stage of the graph (in-process engines, or
    stages in Ray actors: `engine/handles.py`)."""

    def __init__(
        self,
        graph: StageGraph,
        engines: Mapping[str, StageHandle],
        parts: Mapping[str, StageFront],
    ) -> None:
        self.graph = graph
        self._engines = engines
        self._parts = parts
        sources = [n for n, s in graph.stages.items() if s.upstream is None]
        assert len(sources) == 1, f"a pipeline has one source stage, got {sources}"
        self._source = sources[0]
        frontend = parts[self._source].frontend
        assert frontend is not None, f"source stage {self._source!r} takes no speech requests"
        self._frontend: SpeechFrontend = frontend
        (self._final,) = (n for n, s in graph.stages.items() if s.is_final)
        self._sample_rate = graph.model.codec.sample_rate
        self._frame_s = samples_per_frame(graph.model.codec) / self._sample_rate
        self._totals = FlowTotals()
        self._receivers = tuple(n for n, s in graph.stages.items() if s.upstream is not None)
        self.router = Router(
            Topology(
                source=self._source,
                final=self._final,
                downstream={n: s.downstream for n, s in graph.stages.items()},
                engines=engines,
            )
        )
        """Owns every request's state on its own thread (`engine/routing.py`)."""
        for name, engine in engines.items():
            engine.on_output = lambda out, name=name: self.router.post(Emitted(name, out))

    # ------------------------------------------------------------------ public surface

    def info(self) -> PipelineInfo:
        """Static facts of this pipeline (all that serve and bench need to know of it)."""
        f = self._frontend
        return PipelineInfo(
            model=self.graph.model.name,
            pipeline=self.graph.pipeline,
            voices=f.voices,
            languages=f.languages,
            sample_rate=self.graph.model.codec.sample_rate,
            max_new_tokens=f.max_new_tokens,
            supports_instructions=f.supports_instructions,
            stages=tuple(self._engines),
            task_types=(self.graph.model.task_type,),
        )

    def reference_encoder(self) -> ReferenceEncoder | None:
        """The declared voice-clone capability: a Base model's reference encoders (front
        ends encode a reference recording with them, off their event loop, and submit the
        codes and embedding); None: the model does not clone voices."""
        return self._parts[self._source].reference

    def stats(self) -> PipelineStats:
        """Live gauges per stage, the requests in flight and what their buffers hold."""
        in_flight = len(self.router.live)  # read off the router's thread: a count
        buffered = self._totals.buffered
        backlog = {r: self._totals.backlog.get(r, 0) for r in self._receivers}
        stages = tuple(
            dataclasses.replace(e.stats(), backlog_frames=backlog[n]) if n in backlog else e.stats()
            for n, e in self._engines.items()
        )
        return PipelineStats(
            in_flight=in_flight, stages=stages, buffered_audio_s=buffered / self._sample_rate
        )

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None:
        """Call `observer(stage name, seconds)` after each productive engine step."""
        for name, engine in self._engines.items():
            engine.step_observer = lambda seconds, name=name: observer(name, seconds)

    def set_phase_timer(self, timer: PhaseTimer) -> None:
        """Time each stage's step phases (forward, sample, audio; decode vs mixed steps)."""
        for engine in self._engines.values():
            engine.set_timer(timer)

    @property
    def engines(self) -> list[StageHandle]:
        """The stage engines in topological order (tests and the timing bench drive them)."""
        return list(self._engines.values())

    def start(self) -> None:
        self.router.start()
        for e in self._engines.values():
            e.start()

    def stop(self) -> None:
        for e in self._engines.values():
            e.stop()
        self.router.stop()

    # ------------------------------------------------------------------ requests

    def submit(self, speech: SpeechRequest, sink: Sink, limits: RequestLimits = UNBOUNDED) -> None:
        """Start a request. Invalid input raises ValueError before anything is queued; a
        pipeline with a dead stage raises PipelineUnavailable; one that could not seat it
        within `limits.max_wait_s` raises Overloaded. With `limits.max_buffered_s` the
        request is flow-controlled (`engine/flow.py`): the same amount, in frames, bounds
        each receiving stage's backlog of it."""
        dead = [name for name, e in self._engines.items() if not e.alive]
        if dead:
            raise PipelineUnavailable(f"stage {dead[0]!r} has stopped; the pipeline is down")
        if limits.max_wait_s is not None:
            self._admit_by_deadline(limits.max_wait_s)
        first = speech.initial_chunk_frames
        for name, part in self._parts.items():
            limit = part.max_chunk_frames
            if first is not None and limit is not None and first > limit:
                raise ValueError(
                    f"initial_chunk_frames {first} exceeds what stage {name!r} can take in "
                    f"one step ({limit} frames)"
                )
        rid = speech.request_id
        if rid in self.router.live:  # a caller's bug (ids are unique): refused while visible
            raise ValueError(f"request id {rid!r} is already running")
        # After the id check: a stage in an actor keeps what it made until the request's Add.
        requests = {name: part.make_request(speech) for name, part in self._parts.items()}
        buffered = limits.max_buffered_s
        flow = None if buffered is None else self._flow(speech, buffered)
        # Begun before any stage sees it: the router reads its inbox in order, so the
        # request is known before its first output arrives.
        self.router.post(Begin(rid, sink, flow))
        # Downstream first: a receiver holds the request before its first frames arrive.
        for name in reversed(self._engines):
            self._engines[name].send(Add(requests[name], first))

    def _admit_by_deadline(self, max_wait_s: float) -> None:
        """Refuse now what the source stage could not seat within `max_wait_s`."""
        wait = self._engines[self._source].scheduler.first_audio_wait_s()
        if wait is not None and wait > max_wait_s:
            raise Overloaded(
                f"the server is at capacity: this request would wait about {wait:.1f} s "
                f"for a seat (the limit is {max_wait_s:g} s); retry later",
                retry_after_s=wait,
            )

    def abort(self, request_id: str, error: str | None = None) -> None:
        """End the request everywhere: its sink gets one 'abort' event (the client went
        away), or one 'error' event carrying `error` (the server ends it, e.g. shutting
        down)."""
        if error is None:
            event = AudioEvent(request_id, finished=True, finish_reason="abort")
        else:
            event = AudioEvent(request_id, finished=True, finish_reason="error", error=error)
        self.router.post_and_wait(End(request_id, event))  # its terminal event is out on return

    def extend(self, request_id: str, text: str, done: bool) -> None:
        """More text for an incremental request: to the source stage, whose scheduler holds
        it (`core/live.py`); the engine thread applies it between steps."""
        self._engines[self._source].send(ExtendInput(request_id, text, done))

    def consumed(self, request_id: str, samples: int) -> None:
        """The consumer of a flow-controlled request took `samples` of its audio (a request
        that has ended, or has no flow control, ignores it)."""
        self.router.post(Took(request_id, samples))

    def _flow(self, speech: SpeechRequest, max_buffered_s: float) -> RequestFlow:
        edges: dict[str, tuple[str, Bound]] = {}
        frames = math.ceil(max_buffered_s / self._frame_s)
        for name in self._receivers:
            up = self.graph.stages[name].upstream
            assert up is not None
            first = speech.initial_chunk_frames or up.initial_chunk_frames
            edges[name] = (up.stage, edge_bound(frames, first, up.chunk_frames))
        audio = Bound.at(max(1, round(max_buffered_s * self._sample_rate)))
        return RequestFlow(speech.request_id, self._final, audio, edges, self._totals)

    @property
    def num_live(self) -> int:
        """Requests begun and not yet ended (read off the router's thread: a count)."""
        return len(self.router.live)
