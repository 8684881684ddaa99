"""The two-stage and fused pipelines end to end (threads, real engines, tiny model)."""

from __future__ import annotations

import numpy as np
import pytest

from omniflow.core.speech import SpeechRequest
from omniflow.engine.connector import ChunkConnector
from tests.factories import Collector, build, speech, stage_stats, wait_idle

SPF = 1920


def run(orch, req: SpeechRequest) -> Collector:
    c = Collector()
    orch.submit(req, c)
    return c.wait()


@pytest.fixture(scope="module")
def two_stage():
    orch = build("qwen3_tts")
    yield orch
    orch.stop()


@pytest.fixture(scope="module")
def fused():
    orch = build("qwen3_tts_fused")
    yield orch
    orch.stop()


def test_n_frames_give_n_x_1920_samples(two_stage, fused):
    for orch in (two_stage, fused):
        c = run(orch, speech("n", max_new_tokens=13, ignore_eos=True, seed=2))
        assert c.terminal.finish_reason == "length" and c.terminal.error is None
        assert c.terminal.frames == 13
        assert c.pcm.shape == (13 * SPF,)


def test_fused_pcm_equals_two_stage_pcm(two_stage, fused):
    req = dict(max_new_tokens=30, ignore_eos=True, seed=9, text="Equivalence check.")
    a = run(two_stage, speech("eq", **req)).pcm
    b = run(fused, speech("eq", **req)).pcm
    assert a.shape == b.shape == (30 * SPF,)
    assert np.allclose(a, b, atol=1e-5, rtol=0)


def test_initial_chunk_then_chunks_in_order(two_stage):
    c = run(
        two_stage,
        speech("order", max_new_tokens=40, ignore_eos=True, seed=4, initial_chunk_frames=3),
    )
    sizes = [e.pcm.size // SPF for e in c.events if e.pcm is not None]
    # initial chunk 3 frames, then chunks of 25, then the tail of 12
    assert sizes == [3, 25, 12]


def test_concurrent_requests_keep_their_own_audio(two_stage):
    alone = run(two_stage, speech("solo", max_new_tokens=20, ignore_eos=True, seed=5)).pcm
    cs = []
    for i in range(4):
        c = Collector()
        two_stage.submit(
            speech(f"c{i}", max_new_tokens=20 + i, ignore_eos=True, seed=5 if i == 2 else 50 + i), c
        )
        cs.append(c)
    for i, c in enumerate(cs):
        c.wait()
        assert c.pcm.shape == ((20 + i) * SPF,)
    assert np.allclose(cs[2].pcm[: alone.size], alone, atol=1e-5, rtol=0)


def test_abort_mid_request_frees_talker_blocks_and_decoder_slots(two_stage):
    c = Collector()
    first_audio = __import__("threading").Event()

    def sink(ev):
        c(ev)
        if ev.pcm is not None:
            first_audio.set()

    two_stage.submit(speech("abort-me", max_new_tokens=400, ignore_eos=True), sink)
    assert first_audio.wait(30)
    two_stage.abort("abort-me")
    assert c.terminal.finish_reason == "abort"
    # A later request runs to completion, and the engines are idle afterwards with every
    # KV block and decoder slot back in its pool.
    run(two_stage, speech("after", max_new_tokens=5, ignore_eos=True))
    wait_idle(two_stage)
    assert stage_stats(two_stage, "talker").kv_blocks_used == 0
    assert stage_stats(two_stage, "code2wav").decoder_slots_used == 0
    assert c.events[-1].finished and len([e for e in c.events if e.finished]) == 1


def test_code2wav_error_reaches_the_caller_once_and_frees_the_talker():
    # A receive deadline far below the time the talker takes for the next 50-frame chunk: the
    # code2wav stage ends the request with one error after the first chunk's audio, and the
    # talker's blocks are freed.
    orch = build(
        "qwen3_tts",
        "pipeline.stages.code2wav.upstream.initial_chunk_frames=2",
        "pipeline.stages.code2wav.upstream.chunk_frames=50",
        "pipeline.stages.code2wav.upstream.receive_timeout_s=0.0001",
    )
    try:
        c = Collector()
        orch.submit(speech("boom", max_new_tokens=200, ignore_eos=True), c)
        c.wait()
        term = c.terminal
        assert term.finish_reason == "error" and "upstream sent no chunk" in term.error
        assert [e.pcm.size // SPF for e in c.events if e.pcm is not None] == [2]
        wait_idle(orch)
        assert stage_stats(orch, "talker").kv_blocks_used == 0
        assert stage_stats(orch, "code2wav").decoder_slots_used == 0
    finally:
        orch.stop()


def test_a_first_chunk_beyond_the_receivers_budget_is_refused_at_submit(two_stage):
    """128 frames x 16 codes fit the 2048-token budget; 129 could never be scheduled."""
    with pytest.raises(ValueError, match="initial_chunk_frames 129"):
        two_stage.submit(speech("too-big", initial_chunk_frames=129), Collector())
    assert two_stage.num_live == 0
    ok = Collector()
    two_stage.submit(speech("fits", initial_chunk_frames=128, max_new_tokens=3), ok)
    assert ok.wait().terminal.error is None


def test_bad_input_is_refused_before_anything_runs(two_stage):
    with pytest.raises(ValueError, match="unknown voice"):
        two_stage.submit(speech("bad", voice="nobody"), Collector())
    with pytest.raises(ValueError, match="empty"):
        two_stage.submit(speech("bad2", text=""), Collector())
    assert two_stage.num_live == 0


def test_connector_cuts_initial_then_chunks_then_tail():
    con = ChunkConnector(initial_chunk_frames=1, chunk_frames=3)
    con.open("r")
    f = [(i,) * 16 for i in range(8)]
    assert [len(c.frames) for c in con.push("r", f[:2], False)] == [1]
    assert [len(c.frames) for c in con.push("r", f[2:5], False)] == [3]
    out = con.push("r", f[5:8], True)
    assert [(len(c.frames), c.last) for c in out] == [(3, False), (1, True)]
    con.open("s", initial_chunk_frames=2)
    out = con.push("s", f[:1], True)
    assert [(len(c.frames), c.last) for c in out] == [(1, True)]


def test_fused_preemption_restores_the_decoder_and_keeps_the_audio():
    calm = build("qwen3_tts_fused")
    squeezed = build(
        "qwen3_tts_fused",
        "pipeline.stages.talker.scheduler.block_size=4",
        "pipeline.stages.talker.scheduler.num_kv_blocks=12",
        "pipeline.stages.talker.scheduler.max_model_len=48",
    )
    try:
        reqs = [
            speech(
                f"p{i}",
                max_new_tokens=14,
                ignore_eos=True,
                seed=i,
                text="Preemption test sentence.",
                non_streaming_mode=False,  # the squeezed pool fits the streaming-text prompt
            )
            for i in range(3)
        ]
        expected = [run(calm, r).pcm for r in reqs]
        cs = [Collector() for _ in reqs]
        for r, c in zip(reqs, cs, strict=True):
            squeezed.submit(r, c)
        for c, ref in zip(cs, expected, strict=True):
            got = c.wait().pcm
            assert got.shape == ref.shape == (14 * SPF,)
            assert np.allclose(got, ref, atol=1e-5, rtol=0)
        assert stage_stats(squeezed, "talker").preemptions > 0
        wait_idle(squeezed)
        assert stage_stats(squeezed, "talker").decoder_slots_used == 0
        (talker,) = squeezed.engines
        assert not talker.runner.parked_ids
    finally:
        calm.stop()
        squeezed.stop()


@pytest.mark.parametrize("pipeline", ["qwen3_tts", "qwen3_tts_fused"])
def test_eos_frame_gives_no_samples(pipeline):
    from tests.factories import eos_bundle

    orch = build(pipeline, bundle=eos_bundle())
    try:
        c = run(orch, speech("eos", max_new_tokens=50))
        # min_new_tokens = 2 audio frames, then EOS (which carries no audio)
        assert c.terminal.finish_reason == "stop"
        assert c.terminal.frames == 2
        assert c.pcm.shape == (2 * SPF,)
    finally:
        orch.stop()


def test_busy_engine_logs_a_stats_line(monkeypatch, caplog):
    import logging

    from omniflow.engine import stage_engine as engine_module

    monkeypatch.setattr(engine_module, "STATS_INTERVAL_S", 0.0)
    orch = build("qwen3_tts_fused")
    try:
        with caplog.at_level(logging.INFO, logger="omniflow.engine.stage_engine"):
            run(orch, speech("log", max_new_tokens=5, ignore_eos=True))
        lines = [r.getMessage() for r in caplog.records if "stage talker:" in r.getMessage()]
        assert lines and "kv_blocks_used=" in lines[0] and "steps/s" in lines[0]
    finally:
        orch.stop()


def test_fused_seeded_pcm_survives_cancellations_and_slot_reuse(fused):
    import threading

    req = speech("again", max_new_tokens=16, ignore_eos=True, seed=21)
    before = run(fused, req).pcm
    got_audio = threading.Event()
    c = Collector()

    def sink(ev):
        c(ev)
        if ev.pcm is not None:
            got_audio.set()

    fused.submit(speech("cancel-me", max_new_tokens=500, ignore_eos=True, seed=1), sink)
    assert got_audio.wait(30)
    fused.abort("cancel-me")
    n_events = len(c.events)
    after = run(fused, req).pcm
    assert np.array_equal(before, after)
    assert len(c.events) == n_events  # nothing arrived for the cancelled request after abort
    assert c.terminal.finish_reason == "abort"


def test_checkpoint_directory_reproduces_the_dummy_pipeline(tmp_path):
    """Save the tiny model's dummy weights in the published layout (model.safetensors,
    config.json, speech_tokenizer/), serve from that directory, and get the same PCM."""
    from omniflow.models.qwen3_tts.codec_loader import save_codec
    from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec
    from omniflow.models.qwen3_tts.loader import save_talker
    from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights, init_dummy
    from omniflow.models.qwen3_tts.vocab import CodecVocab
    from tests.factories import tiny_model_config

    cfg = tiny_model_config()
    talker = Qwen3TTSTalkerWeights(cfg.talker, cfg.code_predictor)
    init_dummy(talker, cfg.seed)
    save_talker(
        talker,
        tmp_path,
        CodecVocab(),
        {"tts_pad_token_id": 259, "tts_bos_token_id": 260, "tts_eos_token_id": 261},
    )
    codec = SpeechTokenizerWeights(cfg.codec)
    init_dummy_codec(codec, cfg.seed + 1)
    save_codec(codec, tmp_path)
    req = speech("ckpt", max_new_tokens=12, ignore_eos=True, seed=3)
    for pipeline in ("qwen3_tts", "qwen3_tts_fused"):
        dummy = build(pipeline)
        loaded = build(pipeline, f"model.path={tmp_path}", "model.tokenizer=byte")
        try:
            assert loaded.graph.model.load == "checkpoint"
            a, b = run(dummy, req).pcm, run(loaded, req).pcm
            assert a.shape == (12 * SPF,) and np.array_equal(a, b)
        finally:
            dummy.stop()
            loaded.stop()


def test_every_sink_call_comes_from_the_router_thread(two_stage):
    """The orchestrator's request state has one owner (`engine/routing.py`): sinks are called
    from its thread alone, whichever stage produced the output or thread aborted it."""
    import threading

    threads: set[str] = set()
    done = Collector()

    def sink(ev):
        threads.add(threading.current_thread().name)
        done(ev)

    two_stage.submit(speech("owned", max_new_tokens=6, ignore_eos=True), sink)
    done.wait()
    aborted = Collector()

    def sink2(ev):
        threads.add(threading.current_thread().name)
        aborted(ev)

    two_stage.submit(speech("cut", max_new_tokens=400, ignore_eos=True), sink2)
    two_stage.abort("cut")
    assert aborted.terminal.finish_reason == "abort"
    assert threads == {"router"}
