"""Checks a speech request body against the served model and the server's limits.

Everything here is known before anything is queued, so a bad request is a 4xx naming the
field and never reaches a stage; admission then refuses work the pipeline cannot take now
(a stopped stage: 503, too many in flight: 429). `omniflow synth` applies the same rules
(`request_errors`) to its request, from the model config alone, before it builds anything.

Every rule a request breaks is reported at once (one error naming each field, the first
field as `param`, each in `errors`), so a client fixes its request in one round trip rather
than one field at a time; on the speech route together with the fields the schema refused
(`with_rule_errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from omniflow.config.server import ServerConfig
from omniflow.core.pipeline import PipelineInfo, PipelineStats
from omniflow.serve.compat import task_field_errors
from omniflow.serve.errors import ApiError, all_of, quoted, unavailable
from omniflow.serve.protocol import SSE_FORMATS, STREAMABLE, SpeechBody
from omniflow.serve.request_body import FieldErrors
from omniflow.serve.text import check_printable, check_speakable

DEFAULT_VOICE = "vivian"
"""The speaker of a CustomVoice request that names none (the server's and synth's one
default); a model without it takes its first speaker."""


def default_voice(voices: Sequence[str]) -> str | None:
    """The voice a CustomVoice request without one gets (None: the model has no speakers)."""
    if DEFAULT_VOICE in voices:
        return DEFAULT_VOICE
    return voices[0] if voices else None


def validate(
    body: SpeechBody, info: PipelineInfo, server: ServerConfig, registered: bool = False
) -> None:
    """Model-dependent checks the request schema cannot make (the schema made the rest):
    one ApiError naming every rule broken. A valid CustomVoice request without a `voice`
    gets the default one here (`default_voice`), so the request that is submitted names
    the speaker it is spoken by. `registered`: `voice` names a registered voice of this
    Base model (voices.py)."""
    errors = request_errors(body, info, server, registered)
    if errors:
        raise all_of(errors)
    if body.task_type == "CustomVoice" and body.voice is None:
        body.voice = default_voice(info.voices)


def request_errors(
    body: SpeechBody, info: PipelineInfo, server: ServerConfig, registered: bool = False
) -> list[ApiError]:
    """Every rule `body` breaks, in field order (empty: a valid request)."""
    errors: list[ApiError] = []

    def check(rule: Callable[[], None]) -> None:
        try:
            rule()
        except ApiError as exc:
            errors.append(exc)

    check(lambda: _check_model(body, info))
    check(lambda: _check_input(body, server))
    errors += _task_errors(body, info, server, registered)
    check(lambda: _check_voice(body, info))
    check(lambda: _check_language(body, info))
    errors += _instruction_errors(body, info, server)
    check(lambda: _check_length(body, info))
    check(lambda: _check_stream(body))
    check(lambda: _check_format(body))
    return errors


READS = {
    "voice": ("task_type",),
    "instructions": ("task_type",),
    "ref_audio": ("task_type",),
    "ref_text": ("task_type", "x_vector_only_mode"),
    "x_vector_only_mode": ("task_type",),
    "ignore_eos": ("max_new_tokens",),
    "response_format": ("stream", "stream_format"),
    "stream": ("stream_format",),
}
"""The fields a rule about a field reads besides it. Where the schema refused one of them,
the rule would judge a default the client did not send, so its error is left out."""
FIELD_ORDER = {name: i for i, name in enumerate(SpeechBody.model_fields)}


def passing_fields(refused: FieldErrors, info: PipelineInfo) -> SpeechBody:
    """The request made of the fields the schema accepted (defaults for the refused ones,
    the served model and a placeholder text for a refused `model` or `input`), so the
    served model's rules can be checked on them."""
    accepted = {
        k: v for k, v in refused.payload.items() if k in FIELD_ORDER and k not in refused.refused
    }
    return SpeechBody.model_validate({"model": info.model, "input": "-"} | accepted)


def with_rule_errors(
    refused: FieldErrors,
    body: SpeechBody,
    info: PipelineInfo,
    server: ServerConfig,
    registered: bool = False,
) -> ApiError:
    """The schema's refusals and the rules `body` (`passing_fields`) breaks, in one error in
    field order, leaving out rules about a refused field or one it reads (`READS`)."""
    rules = [
        e
        for e in request_errors(body, info, server, registered)
        if e.param not in refused.refused
        and refused.refused.isdisjoint(READS.get(e.param or "", ()))
    ]
    errors = refused.errors or []
    return all_of(in_field_order(errors + rules))


def in_field_order(errors: list[ApiError]) -> list[ApiError]:
    """`errors` in the order of the request's fields (a field not in it last), so the one
    error standing for them takes the first field's status (a 404 `model` first)."""
    return sorted(errors, key=lambda e: FIELD_ORDER.get((e.param or "").split(".")[0], 999))


def _check_model(body: SpeechBody, info: PipelineInfo) -> None:
    if body.model != info.model:
        raise ApiError(
            404,
            f"model {quoted(body.model)} is not served; this server serves {info.model!r}",
            "model",
            "not_found_error",
        )


def _check_input(body: SpeechBody, server: ServerConfig) -> None:
    if len(body.input) > server.max_input_chars:
        raise ApiError(
            400,
            f"input is {len(body.input)} characters; the limit is {server.max_input_chars}",
            "input",
        )
    check_speakable(body.input, "input")


def _task_errors(
    body: SpeechBody, info: PipelineInfo, server: ServerConfig, registered: bool
) -> list[ApiError]:
    """The task the model serves, then the fields that task takes (compat.py)."""
    if body.task_type not in info.task_types:
        if body.task_type == "Base":
            message = (
                f"model {info.model} does not support voice cloning (task_type Base needs a "
                "Base model)"
            )
        elif body.task_type == "VoiceDesign":
            message = (
                f"model {info.model} does not design voices from a description (task_type "
                "VoiceDesign needs a VoiceDesign model, e.g. qwen3_tts_1_7b_voicedesign)"
            )
        else:
            message = (
                f"task_type {body.task_type!r} is not served by {info.model}; it serves "
                f"{list(info.task_types)}"
            )
        return [ApiError(400, message, "task_type")]
    errors = task_field_errors(body, registered)
    if body.ref_text is not None and not any(e.param == "ref_text" for e in errors):
        try:
            if len(body.ref_text) > server.max_input_chars:
                raise ApiError(
                    400, f"ref_text is longer than {server.max_input_chars} characters", "ref_text"
                )
            check_speakable(body.ref_text, "ref_text")
        except ApiError as exc:
            errors.append(exc)
    return errors


def _check_voice(body: SpeechBody, info: PipelineInfo) -> None:
    voices = list(info.voices)
    # the others' voice was checked with their task; an unserved task is refused as such
    preset = body.task_type == "CustomVoice" and "CustomVoice" in info.task_types
    if preset and body.voice is not None and body.voice.lower() not in voices:
        raise ApiError(400, f"unknown voice {quoted(body.voice)}; known: {voices}", "voice")


def _check_language(body: SpeechBody, info: PipelineInfo) -> None:
    languages = list(info.languages)
    if body.language.lower() not in languages:
        raise ApiError(
            400, f"unknown language {quoted(body.language)}; known: {languages}", "language"
        )


def _instruction_errors(
    body: SpeechBody, info: PipelineInfo, server: ServerConfig
) -> list[ApiError]:
    if not body.instructions or body.task_type == "Base":  # a clone's: refused with its task
        return []
    if not info.supports_instructions:
        return [ApiError(400, f"instructions are not supported by {info.model}", "instructions")]
    if len(body.instructions) > server.max_input_chars:
        return [
            ApiError(
                400,
                f"instructions are longer than {server.max_input_chars} characters",
                "instructions",
            )
        ]
    try:
        check_printable(body.instructions, "instructions")
    except ApiError as exc:
        return [exc]
    return []


def _check_length(body: SpeechBody, info: PipelineInfo) -> None:
    """max_new_tokens within the model's limit; ignore_eos needs it (it is the length)."""
    if body.max_new_tokens is not None and body.max_new_tokens > info.max_new_tokens:
        raise ApiError(400, f"max_new_tokens must be <= {info.max_new_tokens}", "max_new_tokens")
    if body.ignore_eos and body.max_new_tokens is None:
        raise ApiError(
            400,
            "ignore_eos generates exactly max_new_tokens frames, so it needs max_new_tokens; "
            "without it the request would run to the model's frame cap (minutes of audio)",
            "ignore_eos",
        )


def _check_stream(body: SpeechBody) -> None:
    """Server-sent events are a stream: `stream_format: "sse"` beside an explicit
    `stream: false` is a contradiction, not a choice to ignore one of them (`"audio"` beside
    it is a whole response: `SpeechBody.streaming`)."""
    if "stream" in body.model_fields_set and not body.stream and body.stream_format == "sse":
        raise ApiError(
            400,
            "stream is false but stream_format is 'sse', which streams events: leave out "
            "stream_format (or set it to 'audio') for a whole response, or stream",
            "stream",
        )


def _check_format(body: SpeechBody) -> None:
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
        raise ApiError(
            429,
            "too many requests in flight; retry later",
            None,
            "rate_limit_error",
            {"Retry-After": "1"},
        )


def down_stages(stats: PipelineStats) -> list[str]:
    return [s.name for s in stats.stages if not s.alive]


def down_message(stats: PipelineStats) -> str:
    down = ", ".join(repr(name) for name in down_stages(stats))
    return f"stage {down} has stopped; the pipeline takes no new requests"
