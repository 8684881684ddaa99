"""Stage builders of the Qwen3-TTS family (named by `build/registry.py`).

`build_talker_stage`: the AR talker (codebook-0 LM + code predictor) with its paged-KV
scheduler; with `stream_decode` it also owns the streaming codec decoder and emits PCM (the
fused pipeline). `build_code2wav_stage`: a chunk-receiving generation stage that continues
each request's streaming decoder state chunk by chunk. Both share one set of talker weights
through the build context.

With dummy weights the talker's EOS is a coin the random weights rarely toss, so a request
would run to its frame cap (minutes of noise for "Hello there."). The talker's request
factory then caps each request at the length a real model would give the text
(`speech_frames`); a caller's `max_new_tokens` stays an upper bound and `ignore_eos`
requests (fixed-length benchmarks) keep their exact length. Real weights keep EOS-driven
length.

Voice clone: a stage that decodes audio with a resolved `ref_context_frames` holds each
request's last N reference frames (`ReferencePriming`) from the moment its stage request is
made until its decoder slot is taken and primed with them.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from omniflow.build.context import BuildContext
from omniflow.config.graph import ResolvedStage
from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import Request
from omniflow.core.speech import SpeechRequest
from omniflow.engine.connector import ChunkConnector, ChunkIntake
from omniflow.engine.flow import samples_per_frame
from omniflow.engine.parts import StageParts
from omniflow.models.qwen3_tts.ar_model import SUBTALKER_TOP_K, build_ar_model
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.factory import DTYPES, TalkerBundle, build_talker
from omniflow.models.qwen3_tts.live_text import LiveText
from omniflow.models.qwen3_tts.priming import ReferencePriming
from omniflow.models.qwen3_tts.processor import DEFAULT_MAX_NEW_TOKENS, TalkerProcessor
from omniflow.platforms.base import PLATFORMS
from omniflow.sampling.draw import draw_fixed_policy
from omniflow.sched.ar import ARScheduler
from omniflow.sched.generation import GenerationScheduler, GenRequest
from omniflow.sched.playback import PlaybackClock
from omniflow.worker.ar_runner import ARModelRunner
from omniflow.worker.code2wav import Code2WavRunner
from omniflow.worker.kv_sizing import sized_scheduler

FRAME_RATE = 12.5
"""Codec frames per second of audio (1,920 samples at 24 kHz)."""
LETTERS_PER_S = 14.0
"""Letters and digits per second of speech at a normal rate (about 150 words a minute)."""
SYLLABLES_PER_S = 4.5
"""CJK characters (one syllable each) per second."""
PAUSE_S = 0.2
"""A pause at each sentence or clause mark."""
_PAUSES = set(".,;:!?。，；：！？、")


def speech_seconds(text: str) -> float:
    """About how long a speaker takes to say `text` (a duration estimate, not a model)."""
    letters = syllables = pauses = 0
    for ch in text:
        if ch in _PAUSES:
            pauses += 1
        elif unicodedata.east_asian_width(ch) in ("W", "F") and ch.isalpha():
            syllables += 1
        elif ch.isalnum():
            letters += 1
    return letters / LETTERS_PER_S + syllables / SYLLABLES_PER_S + pauses * PAUSE_S


def speech_frames(text: str) -> int:
    """Frames of audio a real model would produce for `text` (at least 2, the model's
    minimum), at FRAME_RATE."""
    return max(2, round(speech_seconds(text) * FRAME_RATE))


def text_length_requests(
    make: Callable[[SpeechRequest], Request],
) -> Callable[[SpeechRequest], Request]:
    """Dummy weights: cap a request's frames at `speech_frames` of its text, so its length
    follows the text as a real model's does (EOS can still end it sooner). A request with
    `ignore_eos` keeps its exact `max_new_tokens`."""

    def make_request(speech: SpeechRequest) -> Request:
        if speech.incremental and not speech.ignore_eos:
            request = make(speech)  # its text is not all here: capped once it is
            assert isinstance(request.live, LiveText)
            request.live.cap = speech_frames
            return request
        if not speech.ignore_eos:
            cap = min(speech_frames(speech.text), DEFAULT_MAX_NEW_TOKENS)
            if speech.max_new_tokens is not None:
                cap = min(cap, speech.max_new_tokens)
            speech = dataclasses.replace(speech, max_new_tokens=cap)
        return make(speech)

    return make_request


def primed_requests(
    make: Callable[[SpeechRequest], Any], priming: ReferencePriming
) -> Callable[[SpeechRequest], Any]:
    """`make`, and the request's reference frames held for its decoder slot (dropped with the
    stage request if it never gets one)."""

    def make_request(speech: SpeechRequest) -> Any:
        request = make(speech)
        priming.register(speech, request)
        return request

    return make_request


def _bundle(ctx: BuildContext) -> TalkerBundle:
    if ctx.prebuilt is not None:
        assert isinstance(ctx.prebuilt, TalkerBundle)
        return ctx.prebuilt
    bundle: TalkerBundle = ctx.share(
        "qwen3_tts.talker", lambda: build_talker(ctx.graph.model, ctx.device)
    )
    return bundle


def _stream_decoder(ctx: BuildContext, slots: int) -> StreamingDecoder:
    model = ctx.graph.model
    path = Path(model.path) if model.load == "checkpoint" and model.path else None
    weights = ctx.share("qwen3_tts.codec", lambda: load_codec(model.codec, path, model.seed + 1))
    # model.codec_dtype, else the platform's: fp32 is exact PCM, fp16 (CUDA) trades a bound.
    dtype = DTYPES[ctx.graph.platform.codec_dtype]
    weights = weights.to(device=ctx.device, dtype=dtype).eval()
    return StreamingDecoder(weights.decoder, slots, ctx.device, dtype)


def playback_clock(stage: ResolvedStage, ctx: BuildContext) -> PlaybackClock | None:
    """Each stream's playback clock: windows sized by slack, arrivals seated alone, admission
    by whether streams keep time (None: no clock, fixed windows)."""
    if stage.playback_margin_ms is None:
        return None
    codec = ctx.graph.model.codec
    # chunks leave while a window runs only under async scheduling (engine/chunk_inbox.py)
    sched = stage.scheduler
    early = isinstance(sched, SchedulerConfig) and sched.async_scheduling
    chunk = stage.audio_chunk_frames if early and stage.audio_chunk_frames < stage.window_k else 0
    return PlaybackClock(
        samples_per_frame(codec) / codec.sample_rate, stage.playback_margin_ms / 1e3, chunk
    )


def build_talker_stage(stage: ResolvedStage, ctx: BuildContext) -> StageParts:
    bundle = _bundle(ctx)
    cfg = stage.scheduler
    assert isinstance(cfg, SchedulerConfig)  # an AR stage's scheduler has the KV cache
    residents = cfg.max_resident_seqs or cfg.max_num_seqs  # each holds a decoder slot
    decoder = _stream_decoder(ctx, residents) if stage.stream_decode else None
    # platform.cuda_graphs: the talker's decode step and the code predictor's 15 steps
    # replay as CUDA graphs per batch bucket.
    graphs = ctx.graph.platform.cuda_graphs
    frame_sample = partial(draw_fixed_policy, top_k=SUBTALKER_TOP_K) if graphs else None
    priming = ReferencePriming(stage.ref_context_frames) if decoder is not None else None
    model = build_ar_model(
        bundle,
        decoder,
        frame_sample,
        max_batch=cfg.max_num_seqs,
        decode_graphs=graphs,
        priming=priming,
        window_k=stage.window_k,
        prompt_graph_tokens=stage.prompt_graph_tokens,
        audio_chunk_frames=stage.audio_chunk_frames,
        audio_pass_steps=stage.audio_pass_steps,
    )
    platform = ctx.graph.platform
    cfg = sized_scheduler(
        cfg, model.kv_spec, ctx.dtype, ctx.device, platform.gpu_memory_utilization, stage.name
    )
    runner = ARModelRunner(
        model,
        cfg,
        ctx.device,
        ctx.dtype,
        batched_decode=PLATFORMS[ctx.graph.platform.name].batched_decode_attention,
        audio_chunk_frames=stage.audio_chunk_frames,
        audio_pass_steps=stage.audio_pass_steps,
    )
    processor = TalkerProcessor(
        bundle.tokenizer,
        bundle.vocab,
        cfg.max_model_len,
        supports_instructions=ctx.graph.model.supports_instructions,
        clone=bundle.clone_shape,
        voice_design=ctx.graph.model.voice_design,
    )
    make_request: Callable[[SpeechRequest], Any] = processor.make_request
    if ctx.graph.model.load == "dummy":
        make_request = text_length_requests(make_request)
    if priming is not None:
        make_request = primed_requests(make_request, priming)
    return StageParts(
        scheduler=ARScheduler(
            cfg,
            window_k=stage.window_k,
            playback=playback_clock(stage, ctx),
            audio_pass_steps=stage.audio_pass_steps,
            limit_key=f"pipeline.stages.{stage.name}.scheduler.max_model_len",
        ),
        runner=runner,
        make_request=make_request,
        frontend=processor,
        # Voice clone: a Base model's encoders, offered by the orchestrator to front ends.
        reference=bundle.reference,
    )


def build_code2wav_stage(stage: ResolvedStage, ctx: BuildContext) -> StageParts:
    up = stage.upstream
    assert up is not None  # a code2wav stage always receives (checked at build time)
    cfg = stage.scheduler
    per_frame = ctx.graph.model.codec.num_quantizers
    scheduler = GenerationScheduler(
        cfg,
        tokens_per_frame=per_frame,
        receive_timeout_s=up.receive_timeout_s,
        atomic_chunks=stage.atomic_chunks,
    )
    intake = (
        ChunkIntake(ChunkConnector(up.initial_chunk_frames, up.chunk_frames), scheduler)
        if stage.receives_chunks
        else None
    )
    priming = ReferencePriming(stage.ref_context_frames)
    return StageParts(
        scheduler=scheduler,
        runner=Code2WavRunner(_stream_decoder(ctx, cfg.max_num_seqs), priming),
        make_request=primed_requests(lambda speech: GenRequest(speech.request_id), priming),
        intake=intake,
        max_chunk_frames=cfg.max_num_batched_tokens // per_frame,
    )
