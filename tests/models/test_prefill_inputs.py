"""`inputs.prefill_inputs` slices each prompt's array layout: it equals the per-position
definition (written out here as the oracle) for CustomVoice and in-context clone prompts,
spans that start or end mid-prompt (chunked prefill), and recompute positions past the prompt."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.interface import PositionSpan
from omniflow.models.qwen3_tts import inputs
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.models.qwen3_tts.prompt import NO_CODEC, TalkerPrompt
from tests.factories import speech, tiny_bundle
from tests.models.test_clone_prompt import clone, frames

G = 16
CPU = torch.device("cpu")


def oracle(spans: list[PositionSpan]):
    """Position by position, from the prompt's fields."""
    text, codes, masks, added_rows = [], [], [], []
    for span in spans:
        p: TalkerPrompt = span.payload
        for pos in range(span.start, span.end):
            if pos < p.prompt_len:
                text.append(p.text_ids[pos])
                frame = p.ref_frame_at(pos)
                cid = p.codec_ids[pos]
                if frame is not None:
                    codes.append(list(frame))
                    masks.append([True] * G)
                else:
                    codes.append([max(cid, 0)] + [0] * (G - 1))
                    masks.append([cid != NO_CODEC] + [False] * (G - 1))
                if pos == p.speaker_pos and p.speaker_embedding is not None:
                    added_rows.append(len(text) - 1)
            else:
                step = pos - p.prompt_len
                text.append(p.trailing_at(step))
                codes.append(list(span.frames[step]))
                masks.append([True] * G)
    return torch.tensor(text), torch.tensor(codes), torch.tensor(masks), added_rows


def custom_voice_prompt() -> TalkerPrompt:
    b = tiny_bundle()
    proc = TalkerProcessor(b.tokenizer, b.vocab, 512)
    return proc.make_request(speech("r", text="Hello there, friend.")).payload


@pytest.mark.parametrize("whole_text", [False, True])
def test_prefill_inputs_equal_the_per_position_definition(whole_text):
    cv = custom_voice_prompt()
    icl = clone("hello there", "hi", 4, non_streaming=whole_text)
    generated = frames(3)  # a preempted request recomputes 3 outputs past its prompt
    spans = [
        PositionSpan(cv, cv.prompt_len, 0, cv.prompt_len, ()),
        PositionSpan(icl, icl.prompt_len, 2, icl.prompt_len - 1, ()),  # mid-prompt chunk
        PositionSpan(icl, icl.prompt_len, 0, icl.prompt_len + 3, generated),
        PositionSpan(cv, cv.prompt_len, cv.prompt_len + 1, cv.prompt_len + 3, generated),
    ]
    got = inputs.prefill_inputs(spans, G, CPU)
    text, codes, masks, added_rows = oracle(spans)
    assert torch.equal(got.side_ids, text)
    assert torch.equal(got.codes, codes)
    assert torch.equal(got.code_mask, masks)
    assert got.added_rows is not None and got.added_rows.tolist() == added_rows
    assert len(added_rows) == 2 and got.added is not None and got.added.shape == (2, 64)
    assert bool(got.code_mask[:, 1:].any())  # the reference frames' codes all count


def test_a_span_of_only_recomputed_positions_and_an_empty_step():
    cv = custom_voice_prompt()
    span = PositionSpan(cv, cv.prompt_len, cv.prompt_len, cv.prompt_len + 2, frames(2))
    got = inputs.prefill_inputs([span], G, CPU)
    text, codes, masks, _ = oracle([span])
    assert torch.equal(got.side_ids, text) and torch.equal(got.codes, codes)
    assert torch.equal(got.code_mask, masks) and got.added_rows is None
    empty = inputs.prefill_inputs([], G, CPU)
    assert empty.side_ids.shape == (0,) and empty.codes.shape == (0, G)
