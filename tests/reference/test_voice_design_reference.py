"""VoiceDesign against the official qwen-tts, through the committed fixture
(tests/reference/fixtures/qwen3_tts_tiny_voicedesign/, made by scripts/make_reference_fixtures.py
from the official `generate_voice_design`; docs/reference.md).

The official classes saved the tiny shapes as a VoiceDesign model (tts_model_type
voice_design, no speakers); the same weights are drawn here by name, that checkpoint is
loaded with `model=qwen3_tts_tiny_voicedesign`, and each request goes through omniflow's
front end as a VoiceDesign request (the description in `instructions`, no voice).
"""

from __future__ import annotations

import pytest
import torch

from tests.reference import ours
from tests.reference.cases import (
    DESIGN_CASES,
    DESIGN_GREEDY_CASES,
    DESIGN_LOGIT_CASES,
    DESIGN_PRESET,
    GREEDY_MAX_NEW_TOKENS,
    Fixture,
)
from tests.reference.test_reference_fixtures import EMBED_TOL, LOGIT_TOL, close
from tests.reference.weights import draw_all, fingerprint

CASES = {c.name: c for c in DESIGN_CASES}


@pytest.fixture(scope="module")
def fx() -> Fixture:
    return Fixture.load(DESIGN_PRESET)


@pytest.fixture(scope="module")
def loaded(fx: Fixture, tmp_path_factory) -> ours.Loaded:
    directory = ours.write_checkpoint(tmp_path_factory.mktemp("official_voice_design"), fx)
    return ours.load_talker(ours.model_config(DESIGN_PRESET, directory))


def test_the_fixture_is_an_official_voice_design_model_with_our_weights(fx, loaded):
    """The official classes wrote a VoiceDesign config (no speakers, no speaker encoder
    tensors), omniflow serves it with no voices, and the drawn talker is the fixture's."""
    assert fx.talker_config["tts_model_type"] == "voice_design"
    assert fx.talker_config["talker_config"]["spk_id"] == {}
    assert not any(k.startswith("speaker_encoder.") for k in fx.talker_shapes)
    assert ours.processor(loaded).voices == ()
    assert fingerprint(draw_all(fx.talker_shapes, fx.meta["seed"])) == pytest.approx(
        fx.meta["fingerprints"]["talker"], rel=1e-9
    )


@pytest.mark.parametrize("case", DESIGN_CASES, ids=lambda c: c.name)
def test_token_ids_and_prompt_embeddings(fx, loaded, case):
    """The official wrapper's tokenized chat and description turns are omniflow's, the
    description's ids head the prompt, and the prompt and trailing text embeddings match
    (no speaker id, both text layouts, `auto` and named languages)."""
    tok = loaded.bundle.tokenizer
    assert tok.encode_chat(case.text) == fx.tensors[f"design/{case.name}/input_ids"].tolist()
    instruct = fx.tensors[f"design/{case.name}/instruct_ids"].tolist()
    assert tok.encode_instruct(case.instruct) == instruct
    p = ours.prompt(loaded, case)
    assert list(p.text_ids[: len(instruct)]) == instruct
    close(ours.embeds(loaded, p), fx.tensors[f"design/{case.name}/embeds"], EMBED_TOL)
    trailing = fx.tensors[f"design/{case.name}/trailing"]
    pad = fx.tensors[f"design/{case.name}/tts_pad"]
    want = torch.cat([trailing, pad.expand(2, -1)])
    close(ours.trailing(loaded, p, trailing.shape[0] + 2), want, EMBED_TOL)


@pytest.mark.parametrize("name", DESIGN_LOGIT_CASES)
def test_talker_logits_over_prompt_and_decode_positions(fx, loaded, name):
    p = ours.prompt(loaded, CASES[name])
    x = ours.embeds(loaded, p, fx.tensors[f"logits/{name}/frames"])
    close(x, fx.tensors[f"logits/{name}/embeds"], EMBED_TOL)
    close(ours.talker_logits(loaded, x), fx.tensors[f"logits/{name}/logits"], LOGIT_TOL)


@pytest.mark.parametrize("name", DESIGN_GREEDY_CASES)
def test_greedy_generation_gives_the_official_codes(fx, loaded, name):
    """The whole loop from a VoiceDesign prompt gives the official frames: to the same EOS
    (omniflow marks it with a None), or to a length stop (the official returns one frame
    fewer, docs/reference.md)."""
    theirs = fx.tensors[f"greedy/{name}/codes"]
    n = theirs.shape[0]
    assert n == fx.meta["greedy_frames"][name]
    frames = ours.greedy(loaded, CASES[name], GREEDY_MAX_NEW_TOKENS)
    if n < GREEDY_MAX_NEW_TOKENS - 1:  # the official stopped at EOS
        assert len(frames) == n + 1 and frames[n] is None
    else:
        assert len(frames) == GREEDY_MAX_NEW_TOKENS and None not in frames
    assert torch.tensor(frames[:n]).equal(theirs)


def test_a_request_that_leaves_out_the_layout_gets_the_official_default(fx, loaded):
    """generate_voice_design defaults to the whole-text layout, and so does a VoiceDesign
    request without non_streaming_mode (vd_auto_whole was made with the wrapper's default)."""
    case = CASES["vd_auto_whole"]
    request = ours.SpeechRequest.create(
        case.text, request_id="vd", language=case.language, instructions=case.instruct
    )
    p = ours.processor(loaded).make_request(request).payload
    close(ours.embeds(loaded, p), fx.tensors["design/vd_auto_whole/embeds"], EMBED_TOL)
