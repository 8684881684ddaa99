"""Small factories with real objects: the tiny model, a talker engine, speech requests."""

from __future__ import annotations

import functools

import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import ModelConfig, SchedulerConfig
from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.factory import TalkerBundle, build_talker
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.sched.ar import ARScheduler
from omniflow.stages.engine import StageEngine
from omniflow.stages.runner import ARModelRunner


@functools.cache
def tiny_model_config() -> ModelConfig:
    return build_graph(compose(["platform=cpu"])).model


@functools.cache
def tiny_bundle() -> TalkerBundle:
    return build_talker(tiny_model_config(), torch.device("cpu"))


def talker_engine(
    *,
    async_scheduling: bool = False,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    max_model_len: int = 512,
    block_size: int = 4,
    num_kv_blocks: int = 512,
) -> tuple[StageEngine, TalkerProcessor]:
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        async_scheduling=async_scheduling,
    )
    bundle = tiny_bundle()
    runner = ARModelRunner(bundle.talker, cfg, torch.device("cpu"), torch.float32)
    engine = StageEngine("talker", ARScheduler(cfg), runner, async_scheduling=async_scheduling)
    return engine, TalkerProcessor(bundle.tokenizer, bundle.vocab, max_model_len)


def speech(rid: str, text: str = "Hello there.", **kw) -> SpeechRequest:
    kw.setdefault("seed", 1)
    kw.setdefault("voice", "vivian")
    return SpeechRequest(request_id=rid, text=text, **kw)
