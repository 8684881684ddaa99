"""RoPE cos/sin looked up by a positions tensor with no host read: what a CUDA graph can record.

`Rotary.cos_sin` reads the largest position back to the host (`.item()`) to grow its table on
demand, which a graph capture refuses. A decode graph knows its largest position up front
(the model length), so this table is built once, eagerly, for all of them, and a step only
indexes it on the device.

The rows are taken from `Rotary.cos_sin` itself (float64 angles, float32 cos/sin, then the
compute dtype), not recomputed here: a lookup is then bitwise what the eager path gets for the
same positions, so a captured step and `Talker.forward` see the same rotary values.
"""

from __future__ import annotations

import torch

from omniflow.models.layers.rotary import Rotary


class RopeTable:
    """cos, sin [max_positions, head_dim] in one dtype on one device."""

    def __init__(
        self, rotary: Rotary, max_positions: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        self.max_positions = max_positions
        positions = torch.arange(max_positions, device=device)
        # Gathering all rows then casting equals casting per lookup: both are elementwise.
        self.cos, self.sin = rotary.cos_sin(positions, dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [*positions.shape, head_dim] for `positions` (int64, each below
        `max_positions`: the caller guarantees it, as a bounds check would read the host)."""
        flat = positions.reshape(-1)
        shape = (*positions.shape, self.cos.shape[-1])
        return (
            self.cos.index_select(0, flat).view(shape),
            self.sin.index_select(0, flat).view(shape),
        )
