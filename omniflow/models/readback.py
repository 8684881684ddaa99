"""A step's sampled codes copied to the host without waiting for the work queued after them.

Why: `tensor.tolist()` waits for everything queued on the stream so far. A decode window
queues the next step's talker forward right behind the codes it is about to read (the
runner's overlap, `stages/runner.py`), so the read must wait for the codes alone: the copy
goes to pinned host memory with `non_blocking=True`, an event is recorded behind it, and
`wait` blocks on that event only. The GPU keeps computing the next step while the host turns
the codes into tokens and outputs.

One copy may be outstanding at a time (the pinned buffer is reused): `start` refuses a
second before the first was waited for. On the CPU the copy is synchronous and there is no
event.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PendingCodes:
    """Codes on their way to the host: `Readback.wait` turns them into lists."""

    host: torch.Tensor
    """[B, G] int64, pinned on CUDA: valid once `copied` has completed."""
    copied: torch.cuda.Event | None
    """Recorded behind the copy on CUDA; None on the CPU (the copy was synchronous)."""


class Readback:
    """One reusable pinned buffer for a [B, G] int64 device tensor per step."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None
        self._pending: PendingCodes | None = None

    def start(self, codes: torch.Tensor) -> PendingCodes:
        """Queue the copy of `codes` [B, G] int64 to the host; returns at once."""
        if self._pending is not None:
            raise RuntimeError("a read-back is still outstanding: wait for it first")
        b, g = codes.shape
        cuda = codes.is_cuda
        if self._host is None or self._host.shape[0] < b or self._host.shape[1] != g:
            rows = max(b, 2 * self._host.shape[0] if self._host is not None else b)
            self._host = torch.empty((rows, g), dtype=torch.int64, pin_memory=cuda)
        host = self._host[:b]
        host.copy_(codes, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending = PendingCodes(host, event)
        return self._pending

    def wait(self, pending: PendingCodes) -> list[list[int]]:
        """The codes as lists, once their copy is done (not the work queued after it)."""
        if pending is not self._pending:
            raise RuntimeError("not the outstanding read-back of this buffer")
        if pending.copied is not None:
            pending.copied.synchronize()
        self._pending = None
        return pending.host.tolist()
