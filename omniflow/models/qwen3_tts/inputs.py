"""The talker's per-position inputs (prompt layout in `prompt.py`) and their embeddings.

A prompt position carries a text id and at most one codec id (column 0, or none: NO_CODEC);
a decode position carries the trailing text id of its step and the previous frame's 16
codes. The prefill path lays both kinds out per position with a mask of which codes count;
the decode path has only decode positions, so its embedding needs no mask at all.
A voice-clone prompt also has whole reference frames (all 16 codes count) and one position
whose codec part is the speaker embedding, a vector added after the masked embedding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omniflow.models.interface import DecodeInputs, PositionSpan, PrefillInputs
from omniflow.models.qwen3_tts.prompt import TalkerPrompt
from omniflow.models.qwen3_tts.talker import Talker, TalkerInputs


def prefill_inputs(
    spans: Sequence[PositionSpan], groups: int, device: torch.device
) -> PrefillInputs:
    """Per position: prompt positions sliced from the request's `TalkerPrompt.layout`, later
    positions (recompute after preemption) from its stored frames."""
    text_ids: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    added_rows: list[int] = []
    added: list[torch.Tensor] = []
    row = 0
    for span in spans:
        p: TalkerPrompt = span.payload
        stop = min(span.end, p.prompt_len)
        if span.start < stop:
            lay = p.layout(groups)
            text_ids.append(lay.text_ids[span.start : stop])
            codes.append(lay.codes[span.start : stop])
            masks.append(lay.mask[span.start : stop])
            if p.speaker_embedding is not None and span.start <= p.speaker_pos < stop:
                added_rows.append(row + p.speaker_pos - span.start)
                added.append(p.speaker_embedding)
            row += stop - span.start
        later = range(max(span.start, p.prompt_len), span.end)
        if later:
            steps = [pos - p.prompt_len for pos in later]
            text_ids.append(np.array([p.trailing_at(s) for s in steps], dtype=np.int64))
            codes.append(np.array([span.frames[s] for s in steps], dtype=np.int64))
            masks.append(np.ones((len(steps), groups), dtype=bool))
            row += len(steps)
    return PrefillInputs(
        side_ids=_tensor(text_ids, np.int64, (0,), device),
        codes=_tensor(codes, np.int64, (0, groups), device),
        code_mask=_tensor(masks, np.bool_, (0, groups), device),
        later_codes=any(bool(m[:, 1:].any()) for m in masks),
        added_rows=(
            torch.tensor(added_rows, dtype=torch.int64, device=device) if added_rows else None
        ),
        added=torch.stack(added).to(device) if added else None,
    )


def _tensor(parts: list[np.ndarray], dtype, empty: tuple[int, ...], device) -> torch.Tensor:
    array = np.concatenate(parts) if parts else np.zeros(empty, dtype=dtype)
    return torch.from_numpy(array.astype(dtype, copy=False)).to(device)


def embed_prefill(talker: Talker, inputs: PrefillInputs) -> torch.Tensor:
    x = talker.embed(
        TalkerInputs(inputs.side_ids, inputs.codes, inputs.code_mask, inputs.later_codes)
    )
    if inputs.added_rows is not None and inputs.added is not None:
        x = x.index_add(0, inputs.added_rows, inputs.added.to(x.dtype))
    return x


@torch.no_grad()
def embed_decode(talker: Talker, inputs: DecodeInputs) -> torch.Tensor:
    """`Talker.embed` for decode positions only: projected text embedding plus all 16 codebook
    embeddings, in the same order of additions. Bitwise equal to the masked path (a mask of
    ones multiplies by exactly 1.0), without its host-side `any()`."""
    t = talker.weights.talker
    x = t.text_projection(t.model.text_embedding(inputs.side_ids))
    x = x + t.model.codec_embedding(inputs.frames[:, 0])
    tables = t.code_predictor.model.codec_embedding
    for g in range(1, talker.num_groups):
        x = x + tables[g - 1](inputs.frames[:, g])
    return x
