"""The playback clock a talker stage is built with knows when a window's audio leaves: every
`audio_chunk_frames` steps where that is less than `window_k` and scheduling is async (the
chunks are sent while the window runs), else at the window's end (`sched/playback.py`, the
first chunk sizes the window)."""

from __future__ import annotations

import pytest
import torch

from omniflow.build.context import BuildContext
from omniflow.build.qwen3_tts import playback_clock
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph

T = "pipeline.stages.talker"


def clock_for(*overrides: str):
    graph = build_graph(compose(["platform=cpu", f"{T}.window_k=4", *overrides]))
    return playback_clock(
        graph.stages["talker"], BuildContext(graph, torch.device("cpu"), torch.float32)
    )


@pytest.mark.parametrize(("chunk", "steps"), [(2, 2), (4, 0), (0, 0)])
def test_the_clock_knows_the_chunk_only_when_it_is_shorter_than_the_window(chunk, steps):
    clock = clock_for(f"{T}.audio_chunk_frames={chunk}")
    assert clock is not None and clock.chunk_steps == steps


def test_sync_scheduling_sends_the_chunks_at_the_windows_end():
    sync = "pipeline.stages.talker.scheduler.async_scheduling=false"
    clock = clock_for(f"{T}.audio_chunk_frames=2", sync)
    assert clock is not None and clock.chunk_steps == 0


def test_no_margin_no_clock():
    assert clock_for(f"{T}.playback_margin_ms=null") is None
