"""GPU: `bench.graph_trace` builds both graphs it traces (pytest -m cuda)."""

from __future__ import annotations

import pytest
import torch

from omniflow.bench.graph_trace import build_graphs, build_prompt_graph

pytestmark = pytest.mark.cuda


def test_the_prompt_graph_and_the_frame_graph_build_and_replay():
    prompt = build_prompt_graph("qwen3_tts_tiny", 16)
    frame = build_graphs("qwen3_tts_tiny", 2).graphs[2]
    for graph in (prompt, frame):
        graph.replay()
    torch.cuda.synchronize()
