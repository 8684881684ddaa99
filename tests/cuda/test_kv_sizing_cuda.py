"""KV pools sized from free GPU memory on a real device."""

from __future__ import annotations

import pytest
import torch

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph

pytestmark = pytest.mark.cuda


def talker_blocks(*overrides: str) -> int:
    spec = compose(["platform=cuda", "pipeline.runtime=in_process", *overrides])
    orch = build_pipeline(build_graph(spec))
    return orch.stats().stages[0].kv_blocks_total


def test_the_pool_is_capped_by_num_kv_blocks_and_grows_with_the_cap():
    assert talker_blocks("pipeline.stages.talker.scheduler.num_kv_blocks=300") == 300
    free, _ = torch.cuda.mem_get_info()
    assert talker_blocks("pipeline.stages.talker.scheduler.num_kv_blocks=100000") > 300
    assert torch.cuda.mem_get_info()[0] < free


def test_a_pool_too_small_for_one_request_is_a_clear_error():
    with pytest.raises(RuntimeError, match="gpu_memory_utilization"):
        talker_blocks("platform.gpu_memory_utilization=0.0001")
