"""A step's sampled codes copied to the host without waiting for the work queued after them.

Why: `tensor.tolist()` waits for everything queued on the stream so far. A decode window
queues the next step's talker forward right behind the codes it is about to read (the
runner's overlap, `stages/runner.py`), so the read must wait for the codes alone: the copy
goes to pinned host memory with `non_blocking=True`, an event is recorded behind it, and
`wait` blocks on that event only. The GPU keeps computing the next step while the host turns
the codes into tokens and outputs.

The pinned buffer is reused, so one copy is current at a time: a new `start` supersedes an
outstanding one (a step that failed between its sampling and its read-back leaves one
behind; the new copy is queued after it on the same stream), and `wait` refuses a superseded
copy, whose buffer now holds another step's codes. On the CPU the copy is synchronous and
there is no event.
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
        """Queue the copy of `codes` [B, G] int64 to the host; returns at once. An
        outstanding copy is superseded (see the module docstring)."""
        b, g = codes.shape
        cuda = codes.is_cuda
        host = self._host
        if host is None or host.shape[0] < b or host.shape[1] != g or host.is_pinned() != cuda:
            rows = max(b, 2 * host.shape[0] if host is not None else b)
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
            raise RuntimeError("not the current read-back of this buffer (superseded or read)")
        if pending.copied is not None:
            pending.copied.synchronize()
        self._pending = None
        return pending.host.tolist()
