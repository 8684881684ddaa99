"""Fields that clients written for another framework's Qwen3-TTS speech API send.

Such clients (vLLM-Omni's, for one) add `task_type`, `non_streaming_mode`, `ref_audio`,
`ref_text` and `x_vector_only_mode` to OpenAI's body. A field with a meaning here is accepted:
`task_type` is one of ours, and `non_streaming_mode` picks the prompt's text layout (true: the
whole text in the prompt, false: one text token per decode step; unset: the model's default,
docs/reference.md). A field that asks for something not built gets a 400 saying what is
missing, rather than pydantic's "Extra inputs are not permitted", which reads like a typo.
These checks run on the parsed JSON before the schema, so the precise message wins over
schema errors the same request also has (a voice-clone request often has no `voice`).
"""

from __future__ import annotations

from typing import Any

from omniflow.serve.errors import ApiError

VOICE_CLONE = {
    "ref_audio": "a reference recording to clone",
    "ref_text": "the transcript of a reference recording",
    "x_vector_only_mode": "cloning from the reference's speaker embedding alone",
}
"""Voice-clone fields: null (and `false` for the flag) mean "not asked" and are accepted."""


def refuse_unbuilt(payload: dict[str, Any]) -> None:
    """400 naming the first field of `payload` that asks for a feature omniflow lacks."""
    for field, what in VOICE_CLONE.items():
        if payload.get(field) not in (None, False):
            raise ApiError(
                400,
                f"voice clone is not built yet; {field} ({what}) cannot be served. Use a "
                "preset voice (GET /v1/audio/voices) and leave out " + ", ".join(VOICE_CLONE),
                field,
            )
