"""Argument checks the fused attention-side kernels share (`frame_attention`,
`norm_rope_write`): a kernel addresses a row's elements as base + column, so every tensor it
reads or writes row by row needs unit stride on its last axis, and an output the caller hands
in must be what the kernel would have allocated. Each refusal is a ValueError naming the
function and the tensor."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def require_unit_stride(fn: str, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Refuse the first named tensor whose last axis is not contiguous."""
    for name, t in tensors:
        if t.stride(-1) != 1:
            raise ValueError(f"{fn}: {name} needs unit stride on its last axis")


def require_like(fn: str, name: str, t: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    """Refuse an output `t` without `like`'s shape, dtype and device, or unit last stride."""
    if (
        t.shape != like.shape
        or t.dtype != like.dtype
        or t.device != like.device
        or t.stride(-1) != 1
    ):
        raise ValueError(
            f"{fn}: {name} {tuple(t.shape)} {t.dtype} on {t.device}, last stride "
            f"{t.stride(-1)}, for {like_name} {tuple(like.shape)} {like.dtype} on {like.device}"
        )
