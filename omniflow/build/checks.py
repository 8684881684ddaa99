"""What a command checks of a request before it builds anything, from the model config
alone: the facts a built pipeline's `info()` will state (voices, languages, limits), so that
synth applies the server's request rules (serve/validation.py) to its request at once, and
the request check of each stage component that takes the request's prompt (synth imports
this only after its config checks, as it loads torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from omniflow.config.schema import SchedulerConfig
from omniflow.core.pipeline import PipelineInfo
from omniflow.models.qwen3_tts.prompt_check import check_voice_and_language, prompt_facts

if TYPE_CHECKING:
    from omniflow.config.graph import StageGraph
    from omniflow.models.shapes import ModelConfig

RequestCheck = Callable[["ModelConfig", "str | None", str], None]
"""(model config, preset voice or None, language) -> None; raises `ConfigError` keyed by the
request field at fault, from the model config alone (no weights), so a command refuses a
request before it builds anything."""

REQUEST_CHECKS: dict[str, RequestCheck] = {
    "qwen3_tts_talker": check_voice_and_language,
}
"""Only components that take the request's prompt have one."""

PromptFacts = Callable[["ModelConfig"], "tuple[tuple[str, ...], tuple[str, ...]]"]
"""(model config) -> (voices, languages) its front end will list once built."""

PROMPT_FACTS: dict[str, PromptFacts] = {
    "qwen3_tts_talker": prompt_facts,
}
"""The front end's facts of each component that takes the request's prompt."""


def request_check(arch: str) -> RequestCheck | None:
    """The request check of `arch` (None: it takes no prompt)."""
    return REQUEST_CHECKS.get(arch)


def request_info(graph: StageGraph) -> PipelineInfo:
    """What the built pipeline's `info()` will say, from the config alone: its source
    stage's voices and languages, the most frames a request may ask for (the source stage's
    `max_model_len`; on CUDA the KV sizing may lower it, which the server then applies),
    and its task (`ModelConfig.task_type`)."""
    model = graph.model
    source = next(s for s in graph.stages.values() if s.upstream is None)
    facts = PROMPT_FACTS.get(source.arch)
    voices, languages = facts(model) if facts is not None else ((), ("auto",))
    scheduler = source.scheduler
    limit = scheduler.max_model_len if isinstance(scheduler, SchedulerConfig) else 0
    return PipelineInfo(
        model=model.name,
        pipeline=graph.pipeline,
        voices=voices,
        languages=languages,
        sample_rate=model.codec.sample_rate,
        max_new_tokens=limit,
        supports_instructions=model.supports_instructions,
        stages=tuple(graph.stages),
        task_types=(model.task_type,),
    )


def parameter_counts(model: ModelConfig) -> dict[str, int]:
    """Parameters of each part the build makes of `model` (`lm`: the talker with its code predictor,
    codec decoder, and a Base model's two encoders), counted on torch's meta device: the
    modules are made from the preset's shapes without memory or initialisation."""
    import torch

    from omniflow.models.meta import on_meta
    from omniflow.models.qwen3_tts.codec_encoder import CodecEncoderShape, CodecEncoderWeights
    from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights
    from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights
    from omniflow.models.qwen3_tts.speaker_encoder import SpeakerEncoder, SpeakerEncoderShape

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    with on_meta():
        counts = {
            "lm": count(Qwen3TTSTalkerWeights(model.talker, model.code_predictor)),
            "codec": count(SpeechTokenizerWeights(model.codec)),
        }
        if model.codec_encoder is not None and model.speaker_encoder is not None:
            enc = CodecEncoderShape(**model.codec_encoder.model_dump())
            spk = SpeakerEncoderShape(**model.speaker_encoder.model_dump())
            # the speaker encoder's log-mel front end has a buffer and no parameters
            counts["encoders"] = count(CodecEncoderWeights(enc)) + count(SpeakerEncoder(spk))
    return counts
