"""One CUDA graph per batch bucket over a wrapper's static buffers: the mechanism shared by
the talker decode step, the code predictor and the codec decoder step.

A graph records fixed shapes and addresses, so a wrapper keeps static input and output
buffers sized for its largest bucket, copies a batch of B rows into the first B rows of the
smallest bucket >= B, pads the rest with inert rows, and replays that bucket's graph.
Subclasses say what a bucket computes (`_step`) and, where running it on whatever the
buffers hold would disturb state, how to warm it up (`_warm_up`). On a device without graphs
(or with `capture=False`) the same buffers and step run eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def bucket_sizes(max_batch: int, buckets: Sequence[int] = BATCH_BUCKETS) -> tuple[int, ...]:
    """The buckets below `max_batch`, plus `max_batch` itself, so every batch the caller
    can send (at most `max_batch` rows) has a graph."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return tuple(sorted({b for b in buckets if 0 < b < max_batch} | {max_batch}))


class BucketGraphs:
    """Bucket bookkeeping, capture and replay; subclasses own the buffers and the step."""

    label = "bucket"
    """What a graph computes, for the build log ("captured 11 <label> graphs ...")."""
    unit = "rows"
    """What a bucket counts (rows of a batch; a prompt graph's buckets count tokens)."""

    def __init__(
        self,
        device: torch.device,
        max_batch: int,
        buckets: Sequence[int],
        capture: bool,
        warmup_iters: int,
        capture_stream: torch.cuda.Stream | None = None,
        pool: tuple[int, int] | None = None,
    ) -> None:
        self.device = device
        self.capture_stream = capture_stream
        """The stream the graphs are captured on (None: torch's shared capture stream). Graphs
        replayed on a stream of their own beside the others are captured on that stream:
        cuBLAS keys its workspace by stream at capture, so graphs captured on one stream
        share a workspace, which is only safe while they replay one after another."""
        self.buckets = bucket_sizes(max_batch, buckets)
        self.graphed = capture and device.type == "cuda"
        self.warmup_iters = warmup_iters
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = pool
        """The memory pool the graphs are captured into (None: a pool of their own, made at
        the first capture). Sets that only ever replay one after another on one stream may
        share one, as the buckets of a set do: their intermediates are rewritten each replay."""

    def bucket_for(self, batch: int) -> int | None:
        """The smallest bucket holding `batch` rows; None above the largest (eager)."""
        return next((k for k in self.buckets if k >= batch), None)

    def _step(self, k: int) -> None:
        """Bucket k's computation over the static buffers (what its graph records)."""
        raise NotImplementedError

    def _warm_up(self, k: int) -> None:
        """Real runs of the step before its capture (lazy library set-up must not happen
        inside one). By default on the rows the buffers hold."""
        for _ in range(self.warmup_iters):
            self._step(k)

    @torch.no_grad()
    def capture_all(self) -> None:
        """Capture every bucket now (largest first, so the smaller ones reuse its pool
        memory) instead of on first use; a no-op when not graphed."""
        if not self.graphed:
            return
        start = time.perf_counter()
        todo = [k for k in sorted(self.buckets, reverse=True) if k not in self.graphs]
        if not todo:
            return
        for k in todo:
            self._capture(k)
        # A build spends most of its time here (warm-ups compile the Triton kernels on a
        # fresh machine): say where it went.
        log.info(
            "captured %d %s graphs (%s up to %d) in %.1f s",
            len(todo),
            self.label,
            self.unit,
            max(self.buckets),
            time.perf_counter() - start,
        )

    def _compute(self, k: int) -> None:
        """Bucket k over the loaded buffers: replay its graph (captured on first use) or run
        the step eagerly."""
        if not self.graphed:
            self._step(k)
            return
        if k not in self.graphs:
            self._capture(k)
        self.graphs[k].replay()

    def _capture(self, k: int) -> None:
        """Warm up on a side stream, then record bucket k. `thread_local` capture: other
        engine threads may keep using the GPU meanwhile; only this thread is barred from
        syncing calls. Recording runs no kernel."""
        # on the capture stream when there is one: lazy set-up keyed by stream (cuBLAS's
        # workspace) then happens here, not inside the capture, in the graphs' pool
        side = self.capture_stream or torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._warm_up(k)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(
            graph, pool=self.pool, stream=self.capture_stream, capture_error_mode="thread_local"
        ):
            self._step(k)
        self.graphs[k] = graph
