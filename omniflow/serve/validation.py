"""Checks a speech request body against the served model and the server's limits.

Everything here is known before anything is queued, so a bad request is a 4xx naming the
field and never reaches a stage; admission then refuses work the pipeline cannot take now
(a stopped stage: 503, too many in flight: 429).
"""

from __future__ import annotations

from omniflow.config.server import ServerConfig
from omniflow.core.pipeline import PipelineInfo, PipelineStats
from omniflow.serve.compat import check_task_fields
from omniflow.serve.errors import ApiError, clip, unavailable
from omniflow.serve.protocol import SSE_FORMATS, STREAMABLE, SpeechBody
from omniflow.serve.text import check_printable, check_speakable


def validate(
    body: SpeechBody, info: PipelineInfo, server: ServerConfig, registered: bool = False
) -> None:
    """Model-dependent checks the request schema cannot make (the schema made the rest).
    `registered`: `voice` names a registered voice of this Base model (voices.py)."""
    if body.model != info.model:
        raise ApiError(
            404,
            f"model {clip(body.model)!r} is not served; this server serves {info.model!r}",
            "model",
            "not_found_error",
        )
    if len(body.input) > server.max_input_chars:
        raise ApiError(
            400,
            f"input is {len(body.input)} characters; the limit is {server.max_input_chars}",
            "input",
        )
    check_speakable(body.input, "input")
    _check_task(body, info, server, registered)
    voices, languages = list(info.voices), list(info.languages)
    preset = body.task_type != "Base"  # a voice clone's voice was checked with its task
    if preset and body.voice is not None and body.voice.lower() not in voices:
        raise ApiError(400, f"unknown voice {clip(body.voice)!r}; available: {voices}", "voice")
    if body.language.lower() not in languages:
        raise ApiError(
            400, f"unknown language {clip(body.language)!r}; available: {languages}", "language"
        )
    if body.speed != 1.0:
        raise ApiError(
            400,
            "speed other than 1.0 is not supported (no time-stretch is "
            "applied, rather than a silent change)",
            "speed",
        )
    _check_instructions(body, info, server)
    if body.max_new_tokens is not None and body.max_new_tokens > info.max_new_tokens:
        raise ApiError(400, f"max_new_tokens must be <= {info.max_new_tokens}", "max_new_tokens")
    _check_format(body)


def _check_task(
    body: SpeechBody, info: PipelineInfo, server: ServerConfig, registered: bool
) -> None:
    """The task the model serves, then the fields that task takes (compat.py)."""
    if body.task_type not in info.task_types:
        if body.task_type == "Base":
            message = (
                f"model {info.model} does not support voice cloning (task_type Base needs a "
                "Base model)"
            )
        else:
            message = (
                f"task_type {body.task_type!r} is not served by {info.model}; it serves "
                f"{list(info.task_types)}"
            )
        raise ApiError(400, message, "task_type")
    check_task_fields(body, registered)
    if body.ref_text is not None:
        if len(body.ref_text) > server.max_input_chars:
            raise ApiError(
                400, f"ref_text is longer than {server.max_input_chars} characters", "ref_text"
            )
        check_speakable(body.ref_text, "ref_text")


def _check_instructions(body: SpeechBody, info: PipelineInfo, server: ServerConfig) -> None:
    if body.instructions and not info.supports_instructions:
        raise ApiError(400, f"instructions are not supported by {info.model}", "instructions")
    if body.instructions and len(body.instructions) > server.max_input_chars:
        raise ApiError(
            400,
            f"instructions are longer than {server.max_input_chars} characters",
            "instructions",
        )
    if body.instructions:
        check_printable(body.instructions, "instructions")


def _check_format(body: SpeechBody) -> None:
    if body.response_format == "aac":
        raise ApiError(
            400,
            "response_format 'aac' is not supported; use wav, pcm, flac, mp3 or opus",
            "response_format",
        )
    sse = body.stream_format == "sse"
    allowed = SSE_FORMATS if sse else STREAMABLE
    if body.streaming and body.response_format not in allowed:
        how = "stream_format 'sse' carries" if sse else "streaming sends"
        fix = (
            "stream mp3 with stream_format 'audio'"
            if body.response_format in STREAMABLE
            else "flac and opus are encoded whole: leave out stream and stream_format"
        )
        raise ApiError(
            400,
            f"{how} {', '.join(allowed)} audio, not {body.response_format!r} ({fix})",
            "response_format",
        )


def admit(stats: PipelineStats, server: ServerConfig) -> None:
    """Refuse new work the pipeline cannot take now: a stopped stage, or a full server."""
    if not stats.healthy:
        raise unavailable(down_message(stats))
    if stats.in_flight >= server.max_concurrent_requests:
        raise ApiError(429, "too many requests in flight; retry later", None, "rate_limit_error")


def down_stages(stats: PipelineStats) -> list[str]:
    return [s.name for s in stats.stages if not s.alive]


def down_message(stats: PipelineStats) -> str:
    down = ", ".join(repr(name) for name in down_stages(stats))
    return f"stage {down} has stopped; the pipeline takes no new requests"
