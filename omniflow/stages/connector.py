"""The in-process connector between the talker and a chunk-receiving stage.

It cuts each request's stream of codec frames into chunks: the first of
`initial_chunk_frames` (small, so first audio comes early), then `chunk_frames` each, then
whatever remains when the talker finishes (the tail, marked last; possibly empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
        self, request_id: str, frames: list[tuple[int, ...]], finished: bool
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
