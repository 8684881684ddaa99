"""Sizing an AR stage's KV pool from the GPU memory left after weights and graphs.

With `platform.gpu_memory_utilization` set (CUDA), the pool gets every block that fits in
`total x utilization` minus what the process already holds (weights, captured graphs, other
stages' pools), capped by the stage's `num_kv_blocks`; without it the pool is exactly
`num_kv_blocks`. A pool too small for one request of `max_model_len` is a clear error at
start, not a preemption storm later.
"""

from __future__ import annotations

import logging

import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.models.interface import KVCacheSpec

log = logging.getLogger(__name__)


def bytes_per_block(spec: KVCacheSpec, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for one block of tokens."""
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * dtype.itemsize


def blocks_that_fit(free: int, total: int, utilization: float, per_block: int) -> int:
    """Blocks within `total * utilization` once what is already used (`total - free`) is
    counted; never negative."""
    budget = int(total * utilization) - (total - free)
    return max(budget // per_block, 0)


def sized_scheduler(
    cfg: SchedulerConfig,
    spec: KVCacheSpec,
    dtype: torch.dtype,
    device: torch.device,
    utilization: float | None,
    stage: str,
) -> SchedulerConfig:
    """`cfg` with `num_kv_blocks` set from free memory (capped by its own value)."""
    if utilization is None or device.type != "cuda":
        return cfg
    free, total = torch.cuda.mem_get_info(device)
    per_block = bytes_per_block(spec, cfg.block_size, dtype)
    fit = blocks_that_fit(free, total, utilization, per_block)
    blocks = min(cfg.num_kv_blocks, fit)
    if blocks * cfg.block_size < cfg.max_model_len:
        raise RuntimeError(
            f"stage {stage}: only {fit} KV blocks of {cfg.block_size} tokens fit in "
            f"platform.gpu_memory_utilization={utilization} of {total / 2**30:.1f} GiB "
            f"({(total - free) / 2**30:.1f} GiB already in use); one request of max_model_len "
            f"{cfg.max_model_len} needs {-(-cfg.max_model_len // cfg.block_size)}: raise the "
            "utilization or lower max_model_len"
        )
    log.info(
        "stage %s: KV pool of %d blocks (%.2f GiB; %d fit, cap num_kv_blocks=%d)",
        stage,
        blocks,
        blocks * per_block / 2**30,
        fit,
        cfg.num_kv_blocks,
    )
    return cfg.model_copy(update={"num_kv_blocks": blocks})
