"""A step's sampled codes copied to the host without waiting for the work queued after them.

Why: `tensor.tolist()` waits for everything queued on the stream so far. A decode window
queues the whole next step (forward and sampling) right behind the codes it is about to
read (the runner's overlap, `worker/ar_runner.py`), so the read must wait for the codes
alone: the copy goes to pinned host memory with `non_blocking=True`, an event is recorded
behind it, and `wait` blocks on that event only. The GPU keeps computing the next step
while the host turns the codes into tokens and outputs.

The pinned buffers are reused in turn: `depth` copies can be outstanding at once (a window
queues step n+1's sampling before it reads step n's codes: two in flight), and a `start`
that comes back round to a buffer whose copy was never read supersedes it (a step that
failed between its sampling and its read-back, or a queued step discarded because a row
stopped before it; the new copy is queued after it on the same stream). `wait` refuses a
superseded copy, whose buffer now holds another step's codes. On the CPU the copy is
synchronous and there is no event.
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
    """`depth` reusable pinned buffers for [B, G] int64 device tensors, used in turn."""

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._host: list[torch.Tensor | None] = [None] * depth
        self._pending: list[PendingCodes | None] = [None] * depth
        self._next = 0

    def start(self, codes: torch.Tensor) -> PendingCodes:
        """Queue the copy of `codes` [B, G] int64 to the host; returns at once. The next
        buffer's outstanding copy, if any, is superseded (see the module docstring)."""
        b, g = codes.shape
        cuda = codes.is_cuda
        i = self._next
        self._next = (i + 1) % len(self._host)
        host = self._host[i]
        if host is None or host.shape[0] < b or host.shape[1] != g or host.is_pinned() != cuda:
            rows = max(b, 2 * host.shape[0] if host is not None else b)
            host = self._host[i] = torch.empty((rows, g), dtype=torch.int64, pin_memory=cuda)
        view = host[:b]
        view.copy_(codes, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        pending = self._pending[i] = PendingCodes(view, event)
        return pending

    def wait(self, pending: PendingCodes) -> list[list[int]]:
        """The codes as lists, once their copy is done (not the work queued after it)."""
        i = next((j for j, p in enumerate(self._pending) if p is pending), None)
        if i is None:
            raise RuntimeError("not a current read-back of these buffers (superseded or read)")
        if pending.copied is not None:
            pending.copied.synchronize()
        self._pending[i] = None
        return pending.host.tolist()
