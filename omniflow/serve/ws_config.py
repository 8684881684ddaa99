"""A WebSocket `session.config` message checked as the HTTP route checks a body
(docs/websocket.md): every error of it in one `error` event, the session's own fields
(`stream_audio`, `incremental`, vLLM-Omni's name of the first chunk's size), the schema's
and the served model's rules together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from omniflow.config.server import ServerConfig
from omniflow.core.pipeline import PipelineInfo
from omniflow.serve.errors import ApiError, all_of
from omniflow.serve.protocol import STREAMABLE, SpeechBody
from omniflow.serve.request_body import FieldErrors, field_error
from omniflow.serve.validation import (
    in_field_order,
    passing_fields,
    validate,
    with_rule_errors,
)
from omniflow.serve.voices import Clone, VoiceService
from omniflow.serve.ws_events import NOT_IN_CONFIG, PROBE_INPUT


@dataclass(frozen=True)
class SessionConfig:
    """A session's speech request template and its own settings."""

    body: SpeechBody
    saved: Clone | None
    """The registered voice `body.voice` names (None: none)."""
    stream_audio: bool
    incremental: bool


def session_config(
    payload: dict[str, Any], info: PipelineInfo, server: ServerConfig, voices: VoiceService
) -> SessionConfig:
    """The configuration, or one ApiError naming every field it gets wrong."""
    from omniflow.serve.routes import default_task  # the route's own rule

    errors: list[ApiError] = []
    fields = {k: v for k, v in payload.items() if k != "type"}
    for key, why in NOT_IN_CONFIG.items():
        if key in fields:
            errors.append(ApiError(400, f"{key} is not a session.config field: {why}", key))
            del fields[key]
    flags: dict[str, bool] = {}
    for key in ("stream_audio", "incremental"):
        value = fields.pop(key, False)
        if not isinstance(value, bool):
            errors.append(ApiError(400, f"{key} must be true or false", key))
        flags[key] = value is True  # a refused one is judged as false by the other rules
    if "initial_codec_chunk_frames" in fields:  # vLLM-Omni's name for it
        alias = fields.pop("initial_codec_chunk_frames")
        if "initial_chunk_frames" in fields:
            errors.append(
                ApiError(
                    400,
                    "initial_codec_chunk_frames is vLLM-Omni's name for initial_chunk_frames: "
                    "send one of them",
                    "initial_codec_chunk_frames",
                )
            )
        else:
            fields["initial_chunk_frames"] = alias
    fields.setdefault("model", info.model)
    request = {**fields, "input": PROBE_INPUT}
    try:
        body = default_task(SpeechBody.model_validate(request), info)
    except ValidationError as exc:  # the schema's refusals with the rules the rest break
        refused = FieldErrors([field_error(e["loc"], e["msg"]) for e in exc.errors()], request)
        rest = default_task(passing_fields(refused, info), info)
        saved = voices.saved(rest)
        combined = with_rule_errors(refused, rest, info, server, saved is not None)
        errors += combined.errors or [combined]
        errors += [  # the session's own rules, but not about a field the schema refused
            e
            for e in _session_errors(rest, saved, flags["stream_audio"], flags["incremental"])
            if e.param not in refused.refused
        ]
        raise all_of(in_field_order(errors)) from None
    saved = voices.saved(body)
    try:
        validate(body, info, server, registered=saved is not None)
    except ApiError as exc:
        errors += exc.errors or [exc]
    stream_audio, incremental = flags["stream_audio"], flags["incremental"]
    errors += _session_errors(body, saved, stream_audio, incremental)
    if errors:
        raise all_of(in_field_order(errors))
    return SessionConfig(body, saved, stream_audio, incremental)


def _session_errors(
    body: SpeechBody, saved: Clone | None, stream_audio: bool, incremental: bool
) -> list[ApiError]:
    """What the session's own settings refuse of a request."""
    errors = []
    if stream_audio and body.response_format not in STREAMABLE:
        errors.append(
            ApiError(
                400,
                f"stream_audio sends {', '.join(STREAMABLE)}, not {body.response_format!r} "
                "(flac and opus are sent a whole sentence at a time: stream_audio false)",
                "response_format",
            )
        )
    if incremental and body.non_streaming_mode:
        errors.append(
            ApiError(
                400,
                "incremental text is fed one token a step (the streaming layout): leave "
                "non_streaming_mode out or false",
                "non_streaming_mode",
            )
        )
    in_context = (
        saved.ref_codes is not None
        if saved is not None
        else body.task_type == "Base" and not body.x_vector_only_mode
    )
    if incremental and in_context:
        how = "register the voice with" if saved is not None else "set"
        errors.append(
            ApiError(
                400,
                "an in-context voice clone cannot take incremental text (its prompt holds text "
                f"as long as its reference): {how} x_vector_only_mode true",
                "voice" if saved is not None else "x_vector_only_mode",
            )
        )
    return errors
