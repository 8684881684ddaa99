"""A window's codes for the decoder, read on the device when its rows end at different steps.

In a window, rows leave as they stop (a stop token, or their length cap): each row's frames
are those of the window's first steps, a prefix. Decoded as one set of passes over the
longest row's frames, a row that stopped earlier is padded with zero codes and its PCM cut
back to its own frames; grouped by frame count instead, each group runs its own passes (at
natural lengths most windows at many rows have several groups, each a few small decoder
passes), with its codes built on the host from Python tuples. The pad advances the slot of
a row that ends anyway; `StreamSlots` refuses to decode that slot again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omniflow.device.upload import upload_ints
from omniflow.models.interface import SampledStep


def prefix_counts(steps: Sequence[SampledStep]) -> dict[str, int] | None:
    """Frames per request (rows without any left out), in the first step's row order, when
    every row's frames are those of the first steps and every later row was in the first
    step; None otherwise (the caller groups rows on the host)."""
    if not steps:
        return {}
    counts = dict.fromkeys(steps[0].request_ids, 0)
    for s, step in enumerate(steps):
        for rid, frame in zip(step.request_ids, step.sample.outputs, strict=True):
            if rid not in counts:
                return None
            if frame is not None:
                if counts[rid] != s:
                    return None  # a gap: no frame for this row in an earlier step
                counts[rid] += 1
    return {rid: n for rid, n in counts.items() if n}


def gather_codes(
    steps: Sequence[SampledStep], counts: dict[str, int], device: torch.device
) -> torch.Tensor:
    """Codes [rows, frames, 16] of the rows of `counts` (in its order) from the steps'
    `next_frames`, on the device, zeros past each row's last frame (`prefix_counts`)."""
    rows = {rid: i for i, rid in enumerate(counts)}
    frames = max(counts.values())
    width = steps[0].sample.next_frames.shape[-1]
    dst: list[int] = []
    parts: list[torch.Tensor] = []
    for s, step in enumerate(steps[:frames]):
        src = [i for i, f in enumerate(step.sample.outputs) if f is not None]
        if not src:
            continue
        dst.extend(rows[step.request_ids[i]] * frames + s for i in src)
        codes = step.sample.next_frames
        if len(src) != len(step.sample.outputs):
            codes = codes.index_select(0, upload_ints(src, codes.device))
        parts.append(codes)
    out = torch.zeros(len(rows) * frames, width, dtype=torch.int64, device=device)
    out.index_copy_(0, upload_ints(dst, device), torch.cat(parts).to(torch.int64))
    return out.view(len(rows), frames, width)
