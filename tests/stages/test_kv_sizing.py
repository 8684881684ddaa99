"""KV pool sizing from free GPU memory (the arithmetic; the CUDA path runs on the GPU)."""

from __future__ import annotations

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import SchedulerConfig
from omniflow.errors import ConfigError
from omniflow.models.interface import KVCacheSpec
from omniflow.worker.kv_sizing import blocks_that_fit, bytes_per_block, sized_scheduler

GIB = 2**30
SPEC_1_7B = KVCacheSpec(num_layers=28, num_kv_heads=8, head_dim=128)


def test_bytes_per_block_of_the_1_7b_talker():
    # K and V x 28 layers x 16 tokens x 8 heads x 128 dims x 2 bytes (bf16)
    assert bytes_per_block(SPEC_1_7B, 16, torch.bfloat16) == 2 * 28 * 16 * 8 * 128 * 2


def test_blocks_that_fit_count_what_is_already_used():
    per = 1 << 20
    assert blocks_that_fit(free=100 * per, total=100 * per, utilization=0.5, per_block=per) == 50
    # 30 already used: 50 - 30 = 20 left under the 50 % line
    assert blocks_that_fit(free=70 * per, total=100 * per, utilization=0.5, per_block=per) == 20
    assert blocks_that_fit(free=10 * per, total=100 * per, utilization=0.5, per_block=per) == 0


def test_cpu_keeps_num_kv_blocks():
    cfg = SchedulerConfig(num_kv_blocks=123)
    out = sized_scheduler(cfg, SPEC_1_7B, torch.float32, torch.device("cpu"), 0.9, "talker")
    assert out.num_kv_blocks == 123


def test_utilization_is_refused_off_cuda():
    with pytest.raises(ConfigError) as exc:
        build_graph(compose(["platform=cpu", "+platform.gpu_memory_utilization=0.5"]))
    assert exc.value.key == "platform.gpu_memory_utilization"
    assert build_graph(compose(["platform=cuda"])).platform.gpu_memory_utilization == 0.9
