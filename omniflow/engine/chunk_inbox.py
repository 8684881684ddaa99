"""A window's audio chunks, sent while the window still runs (async scheduling only).

The runner queues a chunk's decoder pass every `audio_chunk_frames` steps of a window and,
on an engine that asked for them (`Runner.send_chunks`), hands the chunk here at once, on its
own thread, instead of keeping it for `take_audio`. The engine thread, while it waits for the
step, takes each chunk, waits for its PCM and sends it: a window's audio leaves chunk by
chunk, not in one piece at the window's end. Every submitted step ends with a marker put by
its future's done-callback, on the runner's thread after its chunks, so the engine takes
exactly one step's chunks, in order, per wait (steps run one at a time, in order).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import Future

from omniflow.core.audio import PendingAudio
from omniflow.core.step import StepResult


class ChunkInbox:
    """The chunks of the submitted steps, in order, each step's closed by its end."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[PendingAudio | None] = queue.SimpleQueue()

    def chunk(self, audio: PendingAudio) -> None:
        """A chunk just queued on the device (the runner's thread)."""
        self._items.put(audio)

    def watch(self, step: Future[StepResult]) -> None:
        """Close `step`'s chunks when it ends; call right after submitting it, before the
        next step is submitted."""
        step.add_done_callback(self._ended)

    def _ended(self, _: Future[StepResult]) -> None:
        self._items.put(None)

    def drain(self) -> Iterator[PendingAudio]:
        """The oldest watched step's chunks not taken yet, each as soon as it is queued,
        until that step has ended."""
        while (item := self._items.get()) is not None:
            yield item
