"""Typed gauges a scheduler reports (read by the engine for `Orchestrator.stats()`)."""

from __future__ import annotations

from dataclasses import dataclass

from omniflow.core.pipeline import WindowCounters


@dataclass(frozen=True)
class SchedulerGauges:
    running: int
    waiting: int
    kv_blocks_used: int | None = None
    """None for a scheduler without a KV cache."""
    kv_blocks_total: int | None = None
    windows: WindowCounters | None = None
    """Only on a stage with window_k > 0."""
    preemptions: int | None = None
    paused: int = 0
    """Requests held out of scheduling by backpressure (`pause`)."""
    min_slack_s: float | None = None
    """The least playback slack of a running stream (None: no clock or none playing)."""
