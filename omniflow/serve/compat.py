"""Fields that clients written for another framework's Qwen3-TTS speech API send, and the
rules for how they fit together (model-independent; validation.py checks them against the
served model).

Such clients (vLLM-Omni's, for one) add `task_type`, `non_streaming_mode`, `ref_audio`,
`ref_text` and `x_vector_only_mode` to OpenAI's body. `non_streaming_mode` picks the
prompt's text layout (docs/reference.md). `task_type: "Base"` is a voice clone: `ref_audio`
is required, `ref_text` too unless `x_vector_only_mode` is true (then it must be left out:
the embedding-only layout has no transcript), and `voice` and `instructions` are refused
(the reference is the voice), unless `voice` is a registered voice (voices.py), which
stands for all three reference fields. `task_type: "VoiceDesign"` describes the voice in
`instructions` (required) and names no `voice`. CustomVoice names a `voice` (unset: the
default speaker, validation.py). Neither takes a reference field. Each refusal is a 400
naming the field, so nothing a client sends is silently ignored.
"""

from __future__ import annotations

from omniflow.serve.errors import ApiError, quoted
from omniflow.serve.protocol import SpeechBody

VOICE_CLONE = ("ref_audio", "ref_text", "x_vector_only_mode")
"""Voice-clone fields: null (and `false` for the flag) mean "not asked"."""


def task_field_errors(body: SpeechBody, registered: bool = False) -> list[ApiError]:
    """A 400 naming each field that does not fit the request's task_type. `registered`:
    the request's `voice` is a registered voice of this Base model. A CustomVoice request
    without a voice is valid: it gets the default speaker (validation.py)."""
    if body.task_type != "Base":
        clone = _clone_field_errors(
            body,
            "is a voice-clone field: it needs task_type 'Base' (and a Base model); this "
            f"request's task_type is {body.task_type!r}",
        )
        return _design_errors(body) + clone if body.task_type == "VoiceDesign" else clone
    errors: list[ApiError] = []
    if body.instructions:
        errors.append(
            ApiError(400, "instructions are not supported with voice clone", "instructions")
        )
    if body.voice is not None:
        return errors + _registered_voice_errors(body, registered)
    if not body.ref_audio:  # (its transcript is asked for once there is a reference)
        return errors + [
            ApiError(
                400,
                "a Base model clones a voice: a request needs ref_audio, the recording to "
                "clone (task_type 'Base'), and names no preset voice",
                "ref_audio",
            )
        ]
    try:
        check_ref_text(
            body.x_vector_only_mode,
            body.ref_text,
            "in-context voice clone needs ref_text (the reference's transcript); or set "
            "x_vector_only_mode to clone from the speaker embedding alone",
        )
    except ApiError as exc:
        errors.append(exc)
    return errors


def _design_errors(body: SpeechBody) -> list[ApiError]:
    """VoiceDesign: `instructions` describe the voice (required, as vLLM-Omni requires it),
    so no preset `voice` is named."""
    errors = []
    if body.voice is not None:
        errors.append(
            ApiError(
                400,
                f"voice {quoted(body.voice)} is not used with task_type 'VoiceDesign': a "
                "VoiceDesign model has no preset voices, instructions describe the voice; "
                "leave out voice",
                "voice",
            )
        )
    if not (body.instructions and body.instructions.strip()):
        errors.append(
            ApiError(
                400,
                "task_type 'VoiceDesign' needs instructions: the voice described in natural "
                "language (e.g. 'a warm, low female voice, speaking slowly')",
                "instructions",
            )
        )
    return errors


def check_ref_text(x_vector_only: bool | None, ref_text: str | None, missing: str) -> None:
    """A transcript for an in-context clone, none with x_vector_only_mode (the
    embedding-only layout has no transcript): else a 400 naming ref_text, `missing` its
    message where the transcript is absent or blank. A speech request's reference and a
    voice registration follow the same rule (voices.py)."""
    if x_vector_only:
        if ref_text is not None:
            raise ApiError(
                400,
                "ref_text is not used with x_vector_only_mode (the speaker embedding alone); "
                "leave one of them out",
                "ref_text",
            )
    elif not (ref_text and ref_text.strip()):
        raise ApiError(400, missing, "ref_text")


def _registered_voice_errors(body: SpeechBody, registered: bool) -> list[ApiError]:
    """A Base request naming a voice: it must be a registered one, and the reference fields
    (which it stands for) must be left out."""
    if body.ref_audio:
        return [
            ApiError(
                400,
                "a voice clone from ref_audio names no voice: the reference recording is the "
                "voice; leave out voice (or ref_audio, to use a registered voice)",
                "voice",
            )
        ]
    if not registered:
        return [
            ApiError(
                400,
                f"voice {quoted(body.voice or '')} is not a registered voice; a Base model has "
                "no preset speakers: clone from ref_audio (the server also takes the id of a "
                "voice registered with POST /v1/audio/voices, listed by GET /v1/audio/voices)",
                "voice",
            )
        ]
    return _clone_field_errors(
        body, "is not used with a registered voice: the voice carries its reference"
    )


def _clone_field_errors(body: SpeechBody, why: str) -> list[ApiError]:
    """A 400 for each voice-clone field the request sets: "<field> <why>"."""
    return [
        ApiError(400, f"{field} {why}; leave out {field}", field)
        for field in VOICE_CLONE
        if getattr(body, field) not in (None, False)
    ]
