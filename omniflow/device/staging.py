"""Persistent host staging buffers with device twins, for the per-step runner inputs.

Building small per-step tensors with `torch.tensor(list, device=...)` costs an allocation, a
pageable copy and, on CUDA, a host synchronisation per tensor. Instead each input has one
host buffer (pinned on CUDA, so the copy is truly asynchronous) written in place through its
numpy view, and one device buffer at a fixed address (what a CUDA graph captures), moved with
one non_blocking copy per step.

A pinned host buffer must not be rewritten while its last copy may still be queued: every
`Staging` records an event after its uploads and waits on it before the next fill. On the
CPU there is nothing to wait for (the copy is a plain memcpy).
"""

from __future__ import annotations

import numpy as np
import torch


class StagedBuffer:
    """One host buffer (written through `.np`) and its device twin."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")
        self.np: np.ndarray = self.host.numpy()
        self.dev = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.host.shape[0]

    def upload(self, n: int) -> torch.Tensor:
        """Copy the first n rows to the device; returns the device view [:n]."""
        dst = self.dev[:n]
        dst.copy_(self.host[:n], non_blocking=True)
        return dst


class Staging:
    """A group of staged buffers filled and uploaded together."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._uploaded: torch.cuda.Event | None = None

    def buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> StagedBuffer:
        return StagedBuffer(shape, dtype, self.device)

    def grown(self, buf: StagedBuffer, rows: int) -> StagedBuffer:
        """`buf`, or a larger one (doubling) when it holds fewer than `rows` rows."""
        if rows <= buf.capacity:
            return buf
        self.begin()  # the old buffer may still be in a queued copy
        shape = (max(rows, 2 * buf.capacity), *buf.host.shape[1:])
        return StagedBuffer(shape, buf.host.dtype, self.device)

    def begin(self) -> None:
        """Call before writing the host buffers: waits until the last uploads have left."""
        if self._uploaded is not None:
            self._uploaded.synchronize()
            self._uploaded = None

    def end(self) -> None:
        """Call after the uploads of one fill."""
        if self.device.type == "cuda":
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()
