"""Chunk intake of a stage that receives frames from an upstream stage (docs/architecture.md:
chunk-receiving stages).

The intake belongs to the receiving stage's engine and is touched only on that engine's
thread: frames arrive as `ReceiveFrames` messages, opening and closing come with `Add` and
`Abort`. It cuts each request's stream of frames into chunks — first `initial_chunk_frames`
(small, so first audio comes early), then `chunk_frames` each, then whatever remains when
the upstream finishes (the tail, marked last; possibly empty) — and hands each chunk to the
stage's scheduler, which schedules it whole (`atomic_chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class ChunkReceiver(Protocol):
    """A scheduler that takes received chunks as its requests' inputs."""

    def receive(self, request_id: str, frames: tuple[tuple[int, ...], ...], last: bool) -> None: ...


@dataclass
class _Stream:
    first: int
    size: int
    buffer: list[tuple[int, ...]] = field(default_factory=list)
    sent_chunks: int = 0


@dataclass(frozen=True)
class OutChunk:
    frames: tuple[tuple[int, ...], ...]
    last: bool


class ChunkConnector:
    """Per-request frame buffers that emit chunks of the configured sizes."""

    def __init__(self, initial_chunk_frames: int, chunk_frames: int) -> None:
        self.initial_chunk_frames = initial_chunk_frames
        self.chunk_frames = chunk_frames
        self._streams: dict[str, _Stream] = {}

    def open(self, request_id: str, initial_chunk_frames: int | None = None) -> None:
        first = initial_chunk_frames or self.initial_chunk_frames
        self._streams[request_id] = _Stream(first=first, size=self.chunk_frames)

    def push(
        self, request_id: str, frames: tuple[tuple[int, ...], ...], finished: bool
    ) -> list[OutChunk]:
        """Add frames; return the chunks now complete (and the tail when finished)."""
        s = self._streams.get(request_id)
        if s is None:
            return []
        s.buffer.extend(frames)
        out: list[OutChunk] = []
        while True:
            want = s.first if s.sent_chunks == 0 else s.size
            if len(s.buffer) < want or (finished and len(s.buffer) == want):
                break
            out.append(OutChunk(tuple(s.buffer[:want]), False))
            del s.buffer[:want]
            s.sent_chunks += 1
        if finished:
            out.append(OutChunk(tuple(s.buffer), True))
            del self._streams[request_id]
        return out

    def close(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    @property
    def num_open(self) -> int:
        return len(self._streams)


class ChunkIntake:
    """The connector feeding a receiving scheduler: frames in, whole chunks queued."""

    def __init__(self, connector: ChunkConnector, receiver: ChunkReceiver) -> None:
        self.connector = connector
        self.receiver = receiver

    def open(self, request_id: str, initial_chunk_frames: int | None) -> None:
        self.connector.open(request_id, initial_chunk_frames)

    def receive(self, request_id: str, frames: tuple[tuple[int, ...], ...], finished: bool) -> None:
        for chunk in self.connector.push(request_id, frames, finished):
            self.receiver.receive(request_id, chunk.frames, chunk.last)

    def hold(self, request_id: str) -> None:
        self.receiver.hold(request_id)

    def close(self, request_id: str) -> None:
        self.connector.close(request_id)
