"""Platform facts the config layer and the runner read.

A platform says which torch device it drives, its default dtype, whether it can capture
graphs and whether decode attention is batched. `auto` is resolved here (cuda when
a CUDA device is visible, else cpu; torch is not imported for it where its build has no GPU
backend); `npu` needs the torch_npu package.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PlatformName = Literal["cpu", "cuda", "npu"]


@dataclass(frozen=True)
class PlatformInfo:
    """Static facts of one platform."""

    name: PlatformName
    device_type: str
    """torch device type ("cpu", "cuda", "npu")."""
    default_dtype: str
    has_graph_capture: bool
    required_module: str | None
    """A Python module the platform cannot work without."""
    batched_decode_attention: bool = False
    """Decode and mixed (prefill) steps attend in one padded batch instead of request by
    request. Off on the CPU, where the per-request path keeps every row bitwise independent
    of its neighbours."""
    codec_dtype: str = "float32"
    """The streaming codec decoder's dtype where `model.codec_dtype` is unset: float16 on
    CUDA (the decoder is most of a large batch's step; its PCM bound: docs/reference.md)."""


PLATFORMS: dict[PlatformName, PlatformInfo] = {
    "cpu": PlatformInfo("cpu", "cpu", "float32", False, None),
    "cuda": PlatformInfo("cuda", "cuda", "bfloat16", True, None, True, "float16"),
    "npu": PlatformInfo("npu", "npu", "bfloat16", False, "torch_npu"),
}


def module_available(name: str) -> bool:
    """Whether `name` can be imported, without importing it."""
    return importlib.util.find_spec(name) is not None


def torch_build_has_gpu() -> bool:
    """Whether the installed torch was built for a GPU (CUDA or ROCm), read from its generated
    `torch/version.py` without importing torch (a second of every CLI start on a CPU build)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    path = Path(spec.origin).with_name("version.py")
    version = importlib.util.spec_from_file_location("omniflow_torch_version", path)
    if not path.is_file() or version is None or version.loader is None:
        return True  # no build record to read: let torch itself answer
    module = importlib.util.module_from_spec(version)
    try:
        version.loader.exec_module(module)
        return module.cuda is not None or module.hip is not None  # torch generates both
    except (OSError, SyntaxError, AttributeError):  # not the record torch writes: ask torch
        return True


def cuda_available() -> bool:
    """Whether torch sees a CUDA device. torch is imported only where its build has a GPU
    backend: the config layer stays light on a CPU build."""
    if not torch_build_has_gpu():
        return False
    import torch

    return torch.cuda.is_available()


def resolve_platform_name(name: str) -> PlatformName:
    """Turn `auto` into a concrete platform; other names pass through."""
    if name == "auto":
        return "cuda" if cuda_available() else "cpu"
    if name not in PLATFORMS:
        raise KeyError(name)
    return name  # type: ignore[return-value]


def prepare_device(device_type: str, cudnn_benchmark: bool = False) -> None:
    """Process-wide settings for a platform, applied once before a runner is built.

    CUDA: cuDNN's fused attention is turned off for scaled_dot_product_attention: for our
    small decode shapes its host time per call, far above flash and memory-efficient
    attention's, is a large share of a talker step's host time (measured: see
    docs/performance.md).

    `cudnn_benchmark` (`platform.cudnn_benchmark`): cuDNN times its algorithms for each new
    convolution shape and keeps the fastest. The codec decoder's fp32 transposed convolutions
    otherwise run a slow fallback kernel (measured: see docs/performance.md). The first call
    of each shape pays the timing (graph warm-ups do).
    """
    if device_type == "cuda":
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cudnn.benchmark = cudnn_benchmark
