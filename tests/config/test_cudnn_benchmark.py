"""`platform.cudnn_benchmark`: on in `platform=cuda` (off in the schema), set on the process by
`prepare_device` on CUDA (the codec decoder's convolutions, docs/benchmarks.md), refused on a
platform without cuDNN."""

from __future__ import annotations

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError
from omniflow.platforms.base import prepare_device


def test_on_in_the_cuda_platform_can_be_turned_off_refused_elsewhere():
    assert build_graph(compose(["platform=cuda"])).platform.cudnn_benchmark is True
    off = build_graph(compose(["platform=cuda", "platform.cudnn_benchmark=false"]))
    assert off.platform.cudnn_benchmark is False
    assert build_graph(compose(["platform=cpu"])).platform.cudnn_benchmark is False
    with pytest.raises(ConfigError) as exc:
        build_graph(compose(["platform=cpu", "+platform.cudnn_benchmark=true"]))
    assert exc.value.key == "platform.cudnn_benchmark"


def test_prepare_device_sets_cudnn_benchmark_on_cuda_only():
    before = torch.backends.cudnn.benchmark
    try:
        prepare_device("cuda", cudnn_benchmark=True)
        assert torch.backends.cudnn.benchmark is True
        prepare_device("cuda")
        assert torch.backends.cudnn.benchmark is False
        torch.backends.cudnn.benchmark = True
        prepare_device("cpu", cudnn_benchmark=False)  # the CPU has no cuDNN to set
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before
        torch.backends.cuda.enable_cudnn_sdp(True)
