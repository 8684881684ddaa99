"""The tiny Base preset (`model=qwen3_tts_tiny_base`): its encoders, their checks against the
talker and the checkpoint, and a voice-clone request through a running pipeline."""

from __future__ import annotations

import re

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.speech import SpeechRequest
from omniflow.errors import ConfigError
from omniflow.models.qwen3_tts.codec_encoder import CodecEncoderShape
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.reference import EncodedReference, build_reference_encoders
from omniflow.models.qwen3_tts.speaker_encoder import SpeakerEncoderShape
from tests.factories import Collector, build, tiny_bundle, wait_idle
from tests.reference import ours
from tests.reference.cases import Fixture, make_audio

CPU = torch.device("cpu")


def base_model(*overrides: str):
    return build_graph(compose(["platform=cpu", "model=qwen3_tts_tiny_base", *overrides])).model


def test_the_base_preset_states_the_reference_tested_encoder_shapes():
    fx = Fixture.load("qwen3_tts_tiny")
    m = base_model()
    enc = CodecEncoderShape(**m.codec_encoder.model_dump())
    spk = SpeakerEncoderShape(**m.speaker_encoder.model_dump())
    assert enc == CodecEncoderShape.from_config(fx.codec_config)
    assert spk == SpeakerEncoderShape.from_config(fx.talker_config["speaker_encoder_config"])
    assert not m.supports_instructions  # Base models take no style instruction
    assert tiny_bundle().clone_shape is None  # the CustomVoice preset has no encoders


def test_the_checkpoint_encoders_load_under_the_base_preset(tmp_path):
    """The official layout (reference fixture) loads strictly with the preset's shapes, and
    gives the encoders the reference comparison checks."""
    fx = Fixture.load("qwen3_tts_tiny")
    d = ours.write_checkpoint(tmp_path, fx, seed=1234)
    m = ours.model_config("qwen3_tts_tiny_base", d)
    bundle = build_talker(m, CPU)
    assert bundle.reference is not None
    audio = fx.tensors["encoder/audio"]
    got = bundle.reference.encode(audio)
    assert torch.equal(torch.tensor(got.ref_codes), fx.tensors["encoder/codes"])
    emb = bundle.reference.speaker.embed(fx.tensors["speaker/audio"][None])[0]
    assert torch.allclose(emb, fx.tensors["speaker/embedding"], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.speaker_encoder.enc_dim=32"], "model.speaker_encoder.enc_dim: is 32 but"),
        (["model.codec_encoder.codebook_size=1024"], "model.codec_encoder.codebook_size: is"),
        (["model.codec_encoder.valid_quantizers=8"], "model.codec_encoder.valid_quantizers"),
        (["model.codec_encoder=null"], "model.speaker_encoder: a voice-clone (Base) model needs"),
        (
            ["model=qwen3_tts_tiny", "+model.codec_encoder.hidden_size=4"],
            "model.codec_encoder: a voice-clone (Base) model needs model.speaker_encoder",
        ),
    ],
)
def test_encoder_shapes_that_do_not_fit_the_talker_are_refused_by_the_config(overrides, message):
    """At configuration time (`omniflow config` included), not when the encoders are built."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        base_model(*overrides)


def test_dummy_encoders_follow_the_seed():
    a, b = build_reference_encoders(base_model()), build_reference_encoders(base_model())
    c = build_reference_encoders(base_model("model.seed=5"))
    for part in ("codec_encoder", "speaker"):
        wa, wb, wc = (getattr(x, part).state_dict() for x in (a, b, c))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def clone_request(rid: str, reference) -> SpeechRequest:
    return SpeechRequest.create(
        "Hello.",
        request_id=rid,
        seed=3,
        max_new_tokens=6,
        ignore_eos=True,
        speaker_embedding=reference.speaker_embedding,
        ref_codes=reference.ref_codes,
        ref_text="Hi.",
    )


def test_a_voice_clone_request_streams_audio_from_the_base_pipeline():
    bundle = build_talker(base_model(), CPU)
    reference = bundle.reference.encode(make_audio("pipeline", 8000))
    orch = build("qwen3_tts_fused", "model=qwen3_tts_tiny_base", bundle=bundle)
    try:
        c = Collector()
        orch.submit(clone_request("clone-1", reference), c)
        c.wait()
        assert c.terminal.error is None and c.pcm.size == 6 * 1920
        wait_idle(orch)
    finally:
        orch.stop()


def test_a_custom_voice_pipeline_refuses_voice_clone_requests():
    reference = EncodedReference(ref_codes=((1,) * 16,) * 3, speaker_embedding=(0.5,) * 64)
    orch = build("qwen3_tts_fused")
    try:
        with pytest.raises(ValueError, match="does not clone voices"):
            orch.submit(clone_request("clone-2", reference), Collector())
    finally:
        orch.stop()
