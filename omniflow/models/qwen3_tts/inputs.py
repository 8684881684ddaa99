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

import torch

from omniflow.models.interface import DecodeInputs, PositionSpan, PrefillInputs
from omniflow.models.qwen3_tts.prompt import NO_CODEC, TalkerPrompt
from omniflow.models.qwen3_tts.talker import Talker, TalkerInputs


def prefill_inputs(
    spans: Sequence[PositionSpan], groups: int, device: torch.device
) -> PrefillInputs:
    """Per position: prompt positions from the request's `TalkerPrompt`, later positions
    (recompute after preemption) from its stored frames."""
    text_ids: list[int] = []
    codes: list[tuple[int, ...]] = []
    masks: list[tuple[bool, ...]] = []
    zeros = (0,) * (groups - 1)
    prompt_mask = (True,) + (False,) * (groups - 1)
    no_mask = (False,) * groups
    full_mask = (True,) * groups
    added_rows: list[int] = []
    added: list[torch.Tensor] = []
    for span in spans:
        p: TalkerPrompt = span.payload
        for pos in range(span.start, span.end):
            if pos < p.prompt_len:
                text_ids.append(p.text_ids[pos])
                frame = p.ref_frame_at(pos)
                cid = p.codec_ids[pos]
                if frame is not None:
                    codes.append(frame)
                    masks.append(full_mask)
                else:
                    codes.append((max(cid, 0), *zeros))
                    masks.append(prompt_mask if cid != NO_CODEC else no_mask)
                if pos == p.speaker_pos and p.speaker_embedding is not None:
                    added_rows.append(len(text_ids) - 1)
                    added.append(p.speaker_embedding)
            else:
                step = pos - p.prompt_len
                text_ids.append(p.trailing_at(step))
                codes.append(span.frames[step])
                masks.append(full_mask)
    return PrefillInputs(
        side_ids=torch.tensor(text_ids, dtype=torch.int64, device=device),
        codes=torch.tensor(codes, dtype=torch.int64, device=device),
        code_mask=torch.tensor(masks, dtype=torch.bool, device=device),
        added_rows=(
            torch.tensor(added_rows, dtype=torch.int64, device=device) if added_rows else None
        ),
        added=torch.stack(added).to(device) if added else None,
    )


def embed_prefill(talker: Talker, inputs: PrefillInputs) -> torch.Tensor:
    x = talker.embed(TalkerInputs(inputs.side_ids, inputs.codes, inputs.code_mask))
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
