"""Builds a running pipeline (engines, runners, models) from a resolved `StageGraph`."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from omniflow.graph import ResolvedStage, StageGraph
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.factory import DTYPES, TalkerBundle, build_talker
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.platforms.base import PLATFORMS, prepare_device
from omniflow.sched.ar import ARScheduler
from omniflow.sched.generation import GenerationScheduler
from omniflow.stages.code2wav import Code2WavRunner
from omniflow.stages.connector import ChunkConnector
from omniflow.stages.engine import StageEngine
from omniflow.stages.orchestrator import Orchestrator
from omniflow.stages.runner import ARModelRunner

log = logging.getLogger(__name__)


def _stream_decoder(graph: StageGraph, slots: int, device: torch.device) -> StreamingDecoder:
    model = graph.model
    path = Path(model.path) if model.load == "checkpoint" and model.path else None
    weights = load_codec(model.codec, path, model.seed + 1)
    # The codec decoder runs in fp32: it is small, and PCM quality and exactness matter more.
    weights = weights.to(device=device, dtype=torch.float32).eval()
    return StreamingDecoder(weights.decoder, slots, device, torch.float32)


def build_pipeline(graph: StageGraph, bundle: TalkerBundle | None = None) -> Orchestrator:
    """Talker (+ code2wav when the graph has it), wired through an orchestrator.

    `bundle` supplies an already built talker (tests, or weights shared between pipelines);
    by default it is built from the graph's model config."""
    device = torch.device(graph.platform.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("platform=cuda but no CUDA device is visible; use platform=cpu")
    prepare_device(device.type)
    dtype = DTYPES[graph.platform.dtype]
    talker_stage: ResolvedStage = graph.stages["talker"]
    bundle = bundle or build_talker(graph.model, device)
    sched_cfg = talker_stage.scheduler
    decoder = (
        _stream_decoder(graph, sched_cfg.max_num_seqs, device)
        if talker_stage.stream_decode
        else None
    )
    runner = ARModelRunner(
        bundle.talker,
        sched_cfg,
        device,
        dtype,
        stream_decoder=decoder,
        batched_decode=PLATFORMS[graph.platform.name].batched_decode_attention,
    )
    talker = StageEngine(
        "talker",
        ARScheduler(sched_cfg, window_k=talker_stage.window_k),
        runner,
        async_scheduling=sched_cfg.async_scheduling,
    )
    processor = TalkerProcessor(
        bundle.tokenizer,
        bundle.vocab,
        sched_cfg.max_model_len,
        supports_instructions=graph.model.supports_instructions,
    )
    code2wav_stage = graph.stages.get("code2wav")
    if code2wav_stage is None:
        return Orchestrator(graph, talker, processor)
    assert code2wav_stage.upstream is not None
    c_cfg = code2wav_stage.scheduler
    gen_sched = GenerationScheduler(
        c_cfg,
        tokens_per_frame=graph.model.codec.num_quantizers,
        receive_timeout_s=code2wav_stage.upstream.receive_timeout_s,
    )
    code2wav = StageEngine(
        "code2wav",
        gen_sched,
        Code2WavRunner(_stream_decoder(graph, c_cfg.max_num_seqs, device)),
        async_scheduling=c_cfg.async_scheduling,
    )
    connector = ChunkConnector(
        code2wav_stage.upstream.initial_chunk_frames, code2wav_stage.upstream.chunk_frames
    )
    return Orchestrator(graph, talker, processor, code2wav=code2wav, connector=connector)
