"""Build-time rules for `platform.*`: which device, dtype and process-wide CUDA settings.

Split from `resolve.py` because one of them, `cudnn_benchmark`, depends on the stage graph:
the platform is resolved first (the stages' rules need its graph capture), and that one
setting is settled once the stages are known (`settle_cudnn_benchmark`).
"""

from __future__ import annotations

import logging

from omniflow.config.graph import ResolvedPlatform, ResolvedStage
from omniflow.config.schema import PlatformConfig
from omniflow.errors import ConfigError
from omniflow.models.shapes import ModelConfig
from omniflow.platforms.base import PLATFORMS, module_available, resolve_platform_name

log = logging.getLogger(__name__)


_DEVICE_INDEX_ONLY_0 = {
    "cpu": "the CPU platform has one device; leave it at 0",
    "cuda": "only 0 on CUDA: the engine threads launch the Triton kernels and replay the CUDA "
    "graphs on their current device, which is 0; choose the GPU with CUDA_VISIBLE_DEVICES=N",
}
"""Why a non-zero `platform.device_index` is refused (it would be ignored on the CPU, and on
CUDA the tensors would live on one GPU while the kernels launch on another)."""


def resolve_platform(
    cfg: PlatformConfig, model: ModelConfig, errors: list[ConfigError]
) -> ResolvedPlatform | None:
    name = resolve_platform_name(cfg.name)
    info = PLATFORMS[name]
    if info.required_module and not module_available(info.required_module):
        errors.append(
            ConfigError(
                "platform.name",
                f"platform {name!r} needs the {info.required_module!r} package, which is not "
                "installed; install it or choose platform=cpu|cuda|auto",
            )
        )
        return None
    if cfg.cuda_graphs and not info.has_graph_capture:
        errors.append(
            ConfigError("platform.cuda_graphs", f"platform {name!r} has no graph capture")
        )
    if cfg.gpu_memory_utilization is not None and name != "cuda":
        errors.append(
            ConfigError(
                "platform.gpu_memory_utilization",
                f"sizes KV pools from CUDA memory; platform {name!r} uses num_kv_blocks",
            )
        )
    if cfg.cudnn_benchmark and name != "cuda":
        errors.append(
            ConfigError("platform.cudnn_benchmark", f"a cuDNN setting; platform {name!r} has none")
        )
    if cfg.device_index and name != "npu":
        errors.append(ConfigError("platform.device_index", _DEVICE_INDEX_ONLY_0[name]))
    dtype = model.dtype or cfg.dtype or info.default_dtype
    device = info.device_type if name == "cpu" else f"{info.device_type}:{cfg.device_index}"
    return ResolvedPlatform(
        name=name,
        device=device,
        dtype=dtype,
        codec_dtype=model.codec_dtype or cfg.codec_dtype or info.codec_dtype,
        cuda_graphs=cfg.cuda_graphs and info.has_graph_capture,
        cudnn_benchmark=bool(cfg.cudnn_benchmark) and name == "cuda",
        gpu_memory_utilization=cfg.gpu_memory_utilization if name == "cuda" else None,
    )


def settle_cudnn_benchmark(
    cfg: PlatformConfig, platform: ResolvedPlatform, stages: dict[str, ResolvedStage]
) -> ResolvedPlatform:
    """`cudnn_benchmark: null` is on only where every convolution shape repeats.

    cuDNN's benchmark mode times its algorithms once per new input shape. The fused
    pipeline's decoder runs fixed per-frame shapes (graph buckets), so the timing is paid once
    and every later step gets the fastest algorithm. A stage whose decode shapes vary from
    step to step would pay the timing again and again, costing more than it gains (measured:
    see docs/performance.md): one that receives chunks (the two-stage pipeline's code2wav:
    batches of varying chunk lengths), and one that primes its decoder with a voice-clone
    reference (a Base model's `ref_context_frames`: the reference's frames are decoded
    eagerly, their count varying by request; the same mechanism). An explicit `true` is
    kept, with a warning naming that cost.
    """
    if platform.name != "cuda":
        return platform
    varying = sorted(s.name for s in stages.values() if s.receives_chunks or s.ref_context_frames)
    if cfg.cudnn_benchmark is None:
        return platform.model_copy(update={"cudnn_benchmark": not varying})
    if cfg.cudnn_benchmark and varying:
        log.warning(
            "platform.cudnn_benchmark=true with stage(s) %s decoding shapes that vary from step "
            "to step (received chunks or voice-clone priming): cuDNN times every new shape "
            "(the two-stage pipeline ran ~5x slower at c8 on the H200); null turns it off "
            "for such pipelines",
            ", ".join(varying),
        )
    return platform
