"""The argument bundles of the attention-side kernels' calling conventions, in torch only: a
model builds them on a machine without Triton, and the kernel and its torch reference take
the same bundle.

`NormRopeArgs`: one layer's q/k/v as projected with what the fused norm+rotary kernels need
(`frame_attention`, `norm_rope_write`). `PagedContext`: where each row's context lies in the
paged KV pool (`paged_decode` and its reference)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class NormRopeArgs:
    """q, k, v as projected (before the q/k norms and rotary), the two norms' weights and
    their eps, the positions' rotary rows, and the layer's K/V caches (written in place)."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_norm_weight: Tensor
    k_norm_weight: Tensor
    eps: float
    cos: Tensor
    sin: Tensor
    k_cache: Tensor
    v_cache: Tensor

    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor in field order (eps left out): both kernels' leading pointers."""
        return (
            self.q,
            self.k,
            self.v,
            self.q_norm_weight,
            self.k_norm_weight,
            self.cos,
            self.sin,
            self.k_cache,
            self.v_cache,
        )


@dataclass(frozen=True)
class PagedContext:
    """A decode batch's contexts in the paged KV pool: row b's first `context_lens[b]`
    positions, in the blocks `block_tables[b]` names, `block_size` tokens a block."""

    block_tables: Tensor
    """[B, max_blocks] int32 (entries past a row's blocks: any valid id, never read)."""
    context_lens: Tensor
    """[B] int32, this step's token included (0: an inert row, its output is 0)."""
    block_size: int
