"""Small host-to-device copies that do not wait for the GPU.

A tensor built on the host and copied to a CUDA device from pageable memory waits for all
the work queued before the copy (the copy is ordered on the stream, and the host buffer
must outlive it). A decode step builds a few such one-off indices (the rows it samples
after a prefill, the decoder slots of its rows): through pinned memory with a non-blocking
copy they cost no wait (torch's pinned allocator keeps the buffer until the copy has run).
Per-step inputs with fixed shapes use persistent staging buffers instead
(`device/staging.py`).
"""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor, any layout) on `device`, without a wait on CUDA. A strided view
    is made contiguous first: torch would otherwise copy through a pageable temporary."""
    if device.type != "cuda" or host.device.type != "cpu":  # not a host-to-GPU copy
        return host.to(device)
    return host.contiguous().pin_memory().to(device, non_blocking=True)


def upload_ints(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 index on `device` from a host list, without a wait on CUDA."""
    return to_device(torch.tensor(values, dtype=torch.int64), device)
