"""Backpressure of one request through the pipeline (docs/reliability.md).

Two buffers grow when whoever consumes a request's output is slower than what feeds it:

- the audio the final stage has handed to the request's consumer (the HTTP response) and the
  consumer has not taken yet (`consumed` reports what it took);
- for each chunk-receiving stage, the frames its upstream has sent and it has not used up
  yet (its outputs carry `consumed_frames`).

Each is bounded with a high-water mark and a low-water mark at half of it: at the high mark
the stage feeding the buffer is sent `Pause` (the final stage for the audio, the upstream
for an edge), at the low mark `Resume`. A paused stage keeps the request's state, so the
pause cascades: a client that stops reading pauses the final stage, whose growing backlog
then pauses its upstream. Nothing here runs on its own: the orchestrator calls it under its
lock and sends the messages it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omniflow.engine.messages import Pause, Resume
from omniflow.models.shapes import CodecShape


@dataclass(frozen=True)
class Bound:
    """Pause at `high` or above, resume at `low` or below."""

    high: int
    low: int

    @classmethod
    def at(cls, high: int) -> Bound:
        return cls(high, high // 2)


def edge_bound(frames: int, first_chunk: int, chunk: int) -> Bound:
    """An edge's bound in frames: what the configured audio amount spans, but at least two of
    the receiver's largest chunks. The receiver only consumes whole chunks, so with a low mark
    under one chunk a paused upstream could wait for frames it alone can send."""
    return Bound.at(max(frames, 2 * max(first_chunk, chunk)))


def samples_per_frame(codec: CodecShape) -> int:
    """PCM samples the codec decodes from one frame (the product of its upsampling factors)."""
    return math.prod(codec.upsampling_ratios) * math.prod(codec.upsample_rates)


FlowMessage = tuple[str, Pause | Resume]
"""A message for the named stage's engine."""


@dataclass
class FlowTotals:
    """What every request's buffers hold together, kept up to date by each change, so that
    the gauges cost O(1) however many requests run (admission reads them per request)."""

    buffered: int = 0
    """Samples handed to consumers and not yet taken."""
    backlog: dict[str, int] = field(default_factory=dict)
    """Receiving stage -> frames received and not yet used up."""


@dataclass
class RequestFlow:
    """One request's buffers and which stages they have paused."""

    request_id: str
    final: str
    """The stage whose audio the consumer takes."""
    audio: Bound
    """The consumer's buffer, in samples."""
    edges: dict[str, tuple[str, Bound]]
    """Receiving stage -> (the stage feeding it, its backlog bound in frames)."""
    totals: FlowTotals = field(default_factory=FlowTotals)
    """Shared by the requests of one pipeline."""
    delivered: int = 0
    consumed: int = 0
    backlog: dict[str, int] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)

    @property
    def buffered(self) -> int:
        """Samples handed to the consumer and not yet taken."""
        return self.delivered - self.consumed

    def on_audio(self, samples: int) -> list[FlowMessage]:
        self.delivered += samples
        self.totals.buffered += samples
        return self._gate(self.final, self.buffered, self.audio)

    def on_consumed(self, samples: int) -> list[FlowMessage]:
        taken = min(samples, self.buffered)  # what was delivered: the totals never go negative
        self.consumed += taken
        self.totals.buffered -= taken
        return self._gate(self.final, self.buffered, self.audio)

    def release(self) -> None:
        """The request ended: its buffers no longer count."""
        self.totals.buffered -= self.buffered
        self.consumed = self.delivered
        for receiver, level in self.backlog.items():
            self.totals.backlog[receiver] = self.totals.backlog.get(receiver, 0) - level
            self.backlog[receiver] = 0

    def on_sent(self, receiver: str, frames: int) -> list[FlowMessage]:
        """`frames` went to `receiver`."""
        return self._edge(receiver, frames)

    def on_used(self, receiver: str, frames: int) -> list[FlowMessage]:
        """`receiver` used up `frames` it had received."""
        return self._edge(receiver, -frames)

    def _edge(self, receiver: str, delta: int) -> list[FlowMessage]:
        edge = self.edges.get(receiver)
        if edge is None:
            return []
        feeder, bound = edge
        level = self.backlog.get(receiver, 0) + delta
        self.backlog[receiver] = level
        self.totals.backlog[receiver] = self.totals.backlog.get(receiver, 0) + delta
        return self._gate(feeder, level, bound)

    def _gate(self, stage: str, level: int, bound: Bound) -> list[FlowMessage]:
        if stage not in self.paused and level >= bound.high:
            self.paused.add(stage)
            return [(stage, Pause(self.request_id))]
        if stage in self.paused and level <= bound.low:
            self.paused.discard(stage)
            return [(stage, Resume(self.request_id))]
        return []
