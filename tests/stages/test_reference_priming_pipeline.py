"""`ref_context_frames` acts in both pipelines of the tiny Base preset: voice-clone requests'
decoder slots are primed with their last N reference frames, whose PCM is never emitted."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.factory import TalkerBundle, build_talker
from tests.factories import Collector, build, stage_stats, wait_idle

SPF = 1920
LSB = 1 / 32768  # one step of 16-bit PCM
BASE = "model=qwen3_tts_tiny_base"


@functools.cache
def base_bundle() -> TalkerBundle:
    model = build_graph(compose(["platform=cpu", BASE])).model
    return build_talker(model, torch.device("cpu"))


def ref_codes(n: int = 30) -> tuple[tuple[int, ...], ...]:
    g = torch.Generator().manual_seed(11)
    return tuple(tuple(r) for r in torch.randint(0, 2048, (n, 16), generator=g).tolist())


def clone(rid: str, frames: int = 8, seed: int = 3, **kw) -> SpeechRequest:
    return SpeechRequest(
        request_id=rid,
        text="Priming check.",
        seed=seed,
        max_new_tokens=frames,
        ignore_eos=True,
        speaker_embedding=tuple(float(i % 7) / 7 for i in range(64)),
        ref_codes=ref_codes(),
        ref_text="Ref.",
        **kw,
    )


def pcm_of(orch, req: SpeechRequest) -> np.ndarray:
    c = Collector()
    orch.submit(req, c)
    c.wait()
    assert c.terminal.error is None
    return c.pcm


@functools.cache
def primed_pcm(pipeline: str, *overrides: str) -> np.ndarray:
    orch = build(pipeline, BASE, *overrides, bundle=base_bundle())
    try:
        pcm = pcm_of(orch, clone("r"))
        again = pcm_of(orch, clone("r2"))
        assert np.array_equal(pcm, again)  # deterministic (and the slot's reuse is clean)
        wait_idle(orch)
        return pcm
    finally:
        orch.stop()


FUSED_N = {
    "unset": (),
    "0": ("pipeline.stages.talker.ref_context_frames=0",),
    "24": ("pipeline.stages.talker.ref_context_frames=24",),
}


def test_context_length_gives_different_deterministic_audio_of_only_generated_frames():
    pcm = {k: primed_pcm("qwen3_tts_fused", *o) for k, o in FUSED_N.items()}
    for p in pcm.values():
        assert p.shape == (8 * SPF,)  # no priming PCM reaches the client
    assert not np.allclose(pcm["unset"], pcm["0"], atol=1e-3)
    assert not np.allclose(pcm["24"], pcm["0"], atol=1e-3)
    assert not np.allclose(pcm["24"], pcm["unset"], atol=1e-3)  # 30 frames held: 72 takes all


@pytest.mark.parametrize("n", ["unset", "24"])
def test_primed_fused_pcm_equals_primed_two_stage_pcm(n):
    two = tuple(
        o.replace("talker", "code2wav", 1).replace("pipeline.", "+pipeline.", 1) for o in FUSED_N[n]
    )
    fused, staged = primed_pcm("qwen3_tts_fused", *FUSED_N[n]), primed_pcm("qwen3_tts", *two)
    assert fused.shape == staged.shape == (8 * SPF,)
    assert np.abs(fused - staged).max() <= LSB


def test_first_chunk_is_the_first_generated_frame():
    """Two-stage with a one-frame first chunk: the first chunk the client gets is one frame
    of audio, not the reference's."""
    orch = build("qwen3_tts", BASE, bundle=base_bundle())
    try:
        c = Collector()
        orch.submit(clone("first", initial_chunk_frames=1), c)
        c.wait()
        chunks = [e.pcm for e in c.events if e.pcm is not None and e.pcm.size]
        assert chunks[0].shape == (SPF,)
        assert np.array_equal(np.concatenate(chunks), primed_pcm("qwen3_tts"))
    finally:
        orch.stop()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_preemption_with_primed_slots_keeps_the_audio(async_scheduling):
    """25 blocks of 4 (one 100-token request's worth): two of the three requests always
    outgrow the pool together, under either schedule (30 blocks preempted only sometimes
    under async scheduling, the fused pipeline's default)."""
    squeezed = build(
        "qwen3_tts_fused",
        BASE,
        "pipeline.stages.talker.scheduler.block_size=4",
        "pipeline.stages.talker.scheduler.num_kv_blocks=25",
        "pipeline.stages.talker.scheduler.max_model_len=100",
        f"pipeline.stages.talker.scheduler.async_scheduling={async_scheduling}",
        bundle=base_bundle(),
    )
    calm = build("qwen3_tts_fused", BASE, bundle=base_bundle())
    try:
        reqs = [clone(f"p{i}", frames=14, seed=i) for i in range(3)]
        expected = [pcm_of(calm, r) for r in reqs]
        cs = [Collector() for _ in reqs]
        for r, c in zip(reqs, cs, strict=True):
            squeezed.submit(r, c)
        for c, want in zip(cs, expected, strict=True):
            got = c.wait().pcm
            assert got.shape == want.shape == (14 * SPF,)
            assert np.allclose(got, want, atol=1e-5, rtol=0)
        assert stage_stats(squeezed, "talker").preemptions > 0
        wait_idle(squeezed)
        (talker,) = squeezed.engines
        assert not talker.runner.parked_ids
    finally:
        calm.stop()
        squeezed.stop()
