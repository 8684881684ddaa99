"""omniflow against the official qwen-tts, through committed fixtures (docs/reference.md).

The fixtures hold the official implementation's config files, tensor names and outputs for
the tiny preset (scripts/make_reference_fixtures.py made them); here the same weights are
drawn by name, written in the published layout, loaded by omniflow's strict loaders, and
every compared quantity is recomputed by omniflow.
"""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights
from omniflow.models.qwen3_tts.vocab import CodecVocab
from tests.reference import ours
from tests.reference.cases import (
    CASES,
    CLONE_CASES,
    GREEDY_CASES,
    GREEDY_MAX_NEW_TOKENS,
    LOGIT_CASES,
    PROMPT_CASES,
    Fixture,
)
from tests.reference.weights import draw_all, fingerprint

PRESET = "qwen3_tts_tiny"
EMBED_TOL = 5e-6
"""Prompt embeddings: the same few ops in the same order; float32 rounding only."""
LOGIT_TOL = 2e-5
"""Logits (values of size ~1) after the transformer stacks: summation order and RoPE tables
computed in float64 here, float32 there."""
PCM_TOL = 1e-5
"""PCM in [-1, 1] after the codec's transformer and upsampling convolutions."""
MEL_TOL = 1e-5
"""Log-mel values of size ~1-10: the same STFT, a filterbank computed without librosa."""
SPEAKER_TOL = 1e-5
"""Speaker embedding (values of size ~1) after the ECAPA-TDNN stack."""


@pytest.fixture(scope="module")
def fx() -> Fixture:
    return Fixture.load(PRESET)


@pytest.fixture(scope="module")
def loaded(fx: Fixture, tmp_path_factory) -> ours.Loaded:
    directory = ours.write_checkpoint(tmp_path_factory.mktemp("official_layout"), fx)
    return ours.load(ours.model_config(PRESET, directory))


def close(ours_value: torch.Tensor, theirs: torch.Tensor, tol: float) -> float:
    assert ours_value.shape == theirs.shape
    diff = float((ours_value.float() - theirs.float()).abs().max())
    assert diff <= tol, f"max abs difference {diff:.3g} > {tol:.3g}"
    return diff


def test_drawn_weights_are_the_ones_the_fixtures_were_made_with(fx):
    decoder = {k: v for k, v in fx.codec_shapes.items() if k.startswith("decoder.")}
    got = {
        "talker": fingerprint(draw_all(fx.talker_shapes, fx.meta["seed"])),
        "decoder": fingerprint(draw_all(decoder, fx.meta["seed"])),
    }
    for part, value in got.items():
        want = fx.meta["fingerprints"][part]
        assert value == pytest.approx(want, rel=1e-9), (
            f"the {part} weights drawn here differ from the fixture's: numpy's legacy "
            "RandomState stream changed? Remake the fixtures (docs/reference.md)"
        )


def shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_official_layout_is_omniflows_layout(fx, loaded):
    """Every tensor the official classes save is one omniflow loads: 0 missing, 0 extra
    (model.safetensors: talker.* and speaker_encoder.*; speech_tokenizer: decoder.*,
    encoder.*)."""
    m = loaded.model
    talker = shapes(Qwen3TTSTalkerWeights(m.talker, m.code_predictor))
    assert {**talker, **shapes(loaded.speaker)} == fx.talker_shapes
    assert {**shapes(loaded.codec), **shapes(loaded.encoder)} == fx.codec_shapes
    official_talker = {k: v for k, v in fx.talker_shapes.items() if k.startswith("talker.")}
    drawn = draw_all(official_talker, fx.meta["seed"])
    for key, value in loaded.bundle.talker.weights.state_dict().items():
        assert torch.equal(value, drawn[key]), key


def test_default_tables_are_the_published_ones(fx):
    """The dummy models' codec ids, languages, speakers and dialects are the checkpoint's."""
    t = fx.talker_config["talker_config"]
    v = CodecVocab()
    assert v.languages == t["codec_language_id"]
    assert v.speakers == t["spk_id"]
    assert v.dialects == {k: d for k, d in t["spk_is_dialect"].items() if d}
    ids = ("pad", "bos", "think", "nothink", "think_bos", "think_eos")
    assert all(getattr(v, i) == t[f"codec_{i}_id"] for i in ids)
    assert v.eos == t["codec_eos_token_id"]


def test_offered_languages_leave_out_dialects_as_the_official_does(fx, loaded):
    keys = fx.talker_config["talker_config"]["codec_language_id"]
    official = ["auto", *sorted(k for k in keys if "dialect" not in k)]
    assert list(ours.processor(loaded).languages) == official
    assert "beijing_dialect" in loaded.bundle.vocab.languages  # read, but not offered


@pytest.mark.parametrize("case", PROMPT_CASES, ids=lambda c: c.name)
def test_prompt_embeddings(fx, loaded, case):
    """CustomVoice layouts, both text layouts, instructions, dialect speakers."""
    p = ours.prompt(loaded, case)
    theirs = fx.tensors[f"prompt/{case.name}/embeds"]
    close(ours.embeds(loaded, p), theirs, EMBED_TOL)
    trailing = fx.tensors[f"prompt/{case.name}/trailing"]
    # the official pads the trailing text with tts_pad; omniflow adds tts_pad past its end
    steps = trailing.shape[0] + 2
    want = torch.cat([trailing, fx.tensors[f"prompt/{case.name}/tts_pad"].expand(2, -1)])
    close(ours.trailing(loaded, p, steps), want, EMBED_TOL)


@pytest.mark.parametrize("case", CLONE_CASES, ids=lambda c: c.name)
def test_voice_clone_prompt_embeddings(fx, loaded, case):
    """Base-model layouts: in context (ref_text + reference codes + speaker embedding; both
    text layouts, text longer and shorter than the reference) and speaker embedding only."""
    p = ours.clone_prompt(loaded, case, fx.tensors)
    close(ours.embeds(loaded, p), fx.tensors[f"clone/{case.name}/embeds"], EMBED_TOL)
    trailing = fx.tensors[f"clone/{case.name}/trailing"]
    pad = fx.tensors["prompt/en_vivian_whole/tts_pad"]
    want = torch.cat([trailing, pad.expand(2, -1)])
    close(ours.trailing(loaded, p, trailing.shape[0] + 2), want, EMBED_TOL)


@pytest.mark.parametrize("name", LOGIT_CASES)
def test_talker_logits_over_prompt_and_decode_positions(fx, loaded, name):
    p = ours.prompt(loaded, CASES[name])
    frames = fx.tensors[f"logits/{name}/frames"]
    x = ours.embeds(loaded, p, frames)
    close(x, fx.tensors[f"logits/{name}/embeds"], EMBED_TOL)
    close(ours.talker_logits(loaded, x), fx.tensors[f"logits/{name}/logits"], LOGIT_TOL)


def test_code_predictor_logits(fx, loaded):
    hidden, codes = fx.tensors["predictor/hidden"], fx.tensors["predictor/codes"]
    theirs = fx.tensors["predictor/logits"]
    close(ours.predictor_logits(loaded, hidden, codes), theirs, LOGIT_TOL)


@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_codec_decoder_pcm(fx, loaded, chunk):
    """Full decode and the streaming decoder (the pipelines' path) in chunks."""
    codes, theirs = fx.tensors["codec/codes"], fx.tensors["codec/pcm"]
    assert float(theirs.abs().max()) < 1.0  # not clamped: the comparison means something
    pcm = (
        ours.codec_pcm(loaded, codes)
        if chunk is None
        else ours.codec_pcm_streamed(loaded, codes, chunk)
    )
    close(pcm, theirs, PCM_TOL)


@pytest.mark.parametrize("name", GREEDY_CASES)
def test_greedy_generation_matches_and_length_stop_keeps_every_frame(fx, loaded, name):
    """The whole loop (prompt, trailing text, repetition penalty, suppressed ids, code
    predictor) gives the official codes. On a length stop the official returns
    max_new_tokens - 1 frames (its last codebook-0 token never gets codebooks 1..15);
    omniflow returns max_new_tokens: the same frames plus the completed last one."""
    theirs = fx.tensors[f"greedy/{name}/codes"]
    n = GREEDY_MAX_NEW_TOKENS
    assert theirs.shape[0] == fx.meta["greedy_frames"][name] == n - 1
    frames = ours.greedy(loaded, CASES[name], n)
    assert None not in frames and len(frames) == n
    assert torch.tensor(frames[: n - 1]).equal(theirs)


def test_codec_encoder_codes_are_exact(fx, loaded):
    """24 kHz audio -> 16 codes per 12.5 Hz frame, the last frame padded."""
    audio, theirs = fx.tensors["encoder/audio"], fx.tensors["encoder/codes"]
    assert theirs.shape == (-(-audio.shape[0] // 1920), 16)
    assert len(theirs.unique()) > theirs.numel() // 4  # varied codes: the match means something
    assert loaded.encoder.encode(audio[None])[0].equal(theirs)


def test_speaker_mel_and_embedding(fx, loaded):
    """torch mel features (no librosa) and the ECAPA-TDNN embedding."""
    audio = fx.tensors["speaker/audio"][None]
    close(loaded.speaker.mel(audio)[0], fx.tensors["speaker/mel"], MEL_TOL)
    close(loaded.speaker.embed(audio)[0], fx.tensors["speaker/embedding"], SPEAKER_TOL)
