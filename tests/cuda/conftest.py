"""CUDA tests share one process: building a pipeline sets process-wide cuDNN flags
(`platforms.base.prepare_device`: `cudnn.benchmark` from `platform.cudnn_benchmark`, on for a
fused CUDA pipeline), so each test gets them back as it found them, and no test's result
depends on which ran before it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def restore_cudnn_flags():
    benchmark = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = benchmark
