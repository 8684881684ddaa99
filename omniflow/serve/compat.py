"""Fields that clients written for another framework's Qwen3-TTS speech API send, and the
rules for how they fit together (model-independent; validation.py checks them against the
served model).

Such clients (vLLM-Omni's, for one) add `task_type`, `non_streaming_mode`, `ref_audio`,
`ref_text` and `x_vector_only_mode` to OpenAI's body. `non_streaming_mode` picks the
prompt's text layout (docs/reference.md). `task_type: "Base"` is a voice clone: `ref_audio`
is required, `ref_text` too unless `x_vector_only_mode` is true (then it must be left out:
the embedding-only layout has no transcript), and `voice` and `instructions` are refused
(the reference is the voice). Any other task names a `voice` and no reference field. Each
refusal is a 400 naming the field, so nothing a client sends is silently ignored.
"""

from __future__ import annotations

from omniflow.serve.errors import ApiError
from omniflow.serve.protocol import SpeechBody

VOICE_CLONE = ("ref_audio", "ref_text", "x_vector_only_mode")
"""Voice-clone fields: null (and `false` for the flag) mean "not asked"."""


def check_task_fields(body: SpeechBody) -> None:
    """400 naming the first field that does not fit the request's task_type."""
    if body.task_type != "Base":
        for field in VOICE_CLONE:
            if getattr(body, field) not in (None, False):
                raise ApiError(
                    400,
                    f"{field} is a voice-clone field: it needs task_type 'Base' (and a Base "
                    f"model); this request's task_type is {body.task_type!r}",
                    field,
                )
        if body.voice is None:
            raise ApiError(
                400, "voice: Field required (a preset voice, GET /v1/audio/voices)", "voice"
            )
        return
    if body.voice is not None:
        raise ApiError(
            400,
            "a voice clone (task_type 'Base') names no voice: the reference recording "
            "(ref_audio) is the voice; leave out voice",
            "voice",
        )
    if body.instructions:
        raise ApiError(400, "instructions are not supported with voice clone", "instructions")
    if not body.ref_audio:
        raise ApiError(400, "task_type 'Base' (voice clone) needs ref_audio", "ref_audio")
    if body.x_vector_only_mode:
        if body.ref_text is not None:
            raise ApiError(
                400,
                "ref_text is not used with x_vector_only_mode (the speaker embedding alone); "
                "leave one of them out",
                "ref_text",
            )
    elif not (body.ref_text and body.ref_text.strip()):
        raise ApiError(
            400,
            "in-context voice clone needs ref_text (the reference's transcript); or set "
            "x_vector_only_mode to clone from the speaker embedding alone",
            "ref_text",
        )
