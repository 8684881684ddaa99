"""On CUDA, capturing a family of bucket graphs logs how many, up to which batch, and how
long it took: the build's longest part on a fresh machine."""

from __future__ import annotations

import logging

import pytest
import torch

from omniflow.models.qwen3_tts.predictor_graph import PredictorGraphs
from omniflow.platforms.base import prepare_device
from tests.cuda.test_predictor_graph_cuda import tiny_parts
from tests.models.test_predictor_graph import subtalker_sample

pytestmark = pytest.mark.cuda


def test_capture_all_logs_the_graphs_it_captured(caplog):
    prepare_device("cuda")
    predictor, embedding = tiny_parts()
    graphs = PredictorGraphs(predictor, embedding, subtalker_sample, max_batch=6)
    with caplog.at_level(logging.INFO, logger="omniflow.device.bucket_graphs"):
        graphs.capture_all()
        graphs.capture_all()  # nothing left to capture: no line
    torch.cuda.synchronize()
    # Only the graph family's logger: building the tiny parts warns about dummy weights.
    lines = [r.getMessage() for r in caplog.records if r.name == "omniflow.device.bucket_graphs"]
    assert lines[0].startswith("captured 4 code-predictor frame graphs (rows up to 6) in "), lines
    assert len(lines) == 1, lines
