"""Rotary position embedding (rotate-half form, as Qwen3 uses).

Qwen3-TTS's talker declares MRoPE, but its three position streams are identical for text
and codec tokens, which makes it exactly plain 1-D RoPE.
"""

from __future__ import annotations

import torch


class Rotary:
    """cos/sin tables by position; built lazily per device and grown on demand."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim = head_dim
        self.inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim)
        )
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _build(self, length: int, device: torch.device) -> None:
        pos = torch.arange(length, dtype=torch.float64, device=self.inv_freq.device)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self._cos = emb.cos().float().to(device)
        self._sin = emb.sin().float().to(device)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, bound: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for `positions` (any shape), with a trailing head_dim axis. `bound`: every
        position is below it, known on the host; without it the largest position is read
        back from the device (a sync that stalls the launches queued behind it)."""
        if bound is not None:
            need = bound
        else:
            need = int(positions.max().item()) + 1 if positions.numel() else 1
        if self._cos is None or self._cos.shape[0] < need or self._cos.device != positions.device:
            self._build(
                max(need, 2 * (self._cos.shape[0] if self._cos is not None else 256)),
                positions.device,
            )
        assert self._cos is not None and self._sin is not None
        return self._cos[positions].to(dtype), self._sin[positions].to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., heads, head_dim]; cos/sin: [..., head_dim] (broadcast over heads)."""
    return x * cos.unsqueeze(-2) + rotate_half(x) * sin.unsqueeze(-2)
