"""The `POST /v1/audio/speech` request body: OpenAI's fields plus omniflow's extensions.

Validation here is per field (types, ranges, choices known without the model); what depends
on the model (voices, languages, input length in tokens) is checked by the app and the
prompt builder. Unknown fields are refused, so a typo is an error naming the field.

Numbers and flags are strict: `"7"`, `true` or `"yes"` where an integer or a boolean belongs
is a 400 rather than a guess (pydantic's lax mode reads `true` as seed 1 and `"yes"` as
true, so a client's bug would go unnoticed). Fields other frameworks' clients send are
declared here; compat.py checks that they fit together (a voice clone names no voice, ...).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from omniflow.core.request import MAX_SPEED, MIN_SPEED

ResponseFormat = Literal["wav", "pcm", "flac", "mp3", "opus"]
"""OpenAI's list but `aac` (no well-kept encoder here): refused with the list of these."""
STREAMABLE = ("wav", "pcm", "mp3")
"""Formats a raw stream (`stream: true` or `stream_format: "audio"`) carries; mp3 is encoded
as it streams (LAME, serve/encoders.py)."""
SSE_FORMATS = ("wav", "pcm")
"""Formats `stream_format: "sse"` events carry (base64 PCM16, WAV-headed for wav)."""
ENCODED = {"flac": ("FLAC", None), "opus": ("OGG", "OPUS")}
"""Formats encoded whole only, written by libsndfile through `soundfile` (mp3, whole or
streamed, is LAME's: serve/encoders.py)."""
MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}


class SpeechBody(BaseModel):
    """One speech request."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "qwen3-tts-tiny",
                    "input": "Hello there.",
                    "voice": "vivian",
                    "response_format": "mp3",
                    "stream_format": "audio",
                }
            ]
        },
    )

    model: str = Field(description="Served model name (GET /v1/models).")
    input: str = Field(description="Text to speak.")
    voice: str | None = Field(
        None,
        description="What GET /v1/audio/voices lists: a preset speaker of a CustomVoice model "
        "(unset: vivian, as omniflow synth), or on a Base model the id of a registered voice "
        "(POST /v1/audio/voices). A voice clone from ref_audio names none.",
    )
    response_format: ResponseFormat = Field("wav", description="Audio container/encoding.")
    speed: float = Field(
        1.0,
        ge=MIN_SPEED,
        le=MAX_SPEED,
        strict=True,
        description="Playback speed, 0.25-4.0: the speech time-scaled, its pitch kept "
        "(whole and streamed responses alike; README, Speed).",
    )
    instructions: str | None = Field(
        None,
        description="Style instruction (models that declare support; not the 0.6B); for "
        "task_type VoiceDesign, the voice described in natural language (required).",
    )
    stream_format: Literal["audio", "sse"] | None = Field(
        None, description="audio: raw bytes as they are produced; sse: server-sent events."
    )
    stream: bool = Field(False, strict=True, description="Stream the audio as it is produced.")
    language: str = Field("auto", description="Language name, or auto.")
    task_type: Literal["CustomVoice", "Base", "VoiceDesign"] = Field(
        "CustomVoice",
        description="Qwen3-TTS task: CustomVoice (a preset voice) on CustomVoice models, Base "
        "(voice clone from ref_audio or a registered voice) on Base models, VoiceDesign (the "
        "voice described in instructions, no voice) on VoiceDesign models. Unset: the "
        "served model's task (CustomVoice on a model that serves it, else its own).",
    )
    seed: int | None = Field(None, ge=0, lt=2**62, strict=True, description="Sampling seed.")
    max_new_tokens: int | None = Field(
        None, ge=1, strict=True, description="Most codec frames to generate."
    )
    ignore_eos: bool = Field(
        False, strict=True, description="Generate exactly max_new_tokens frames."
    )
    initial_chunk_frames: int | None = Field(
        None,
        ge=1,
        le=250,
        strict=True,
        description="Two-stage pipeline: frames in the first chunk.",
    )
    non_streaming_mode: bool | None = Field(
        None,
        strict=True,
        description="Prompt text layout: true the whole text in the prompt, false one text "
        "token per decode step; unset: the model's default (true for CustomVoice).",
    )
    ref_audio: str | None = Field(
        None,
        description="Voice clone (task_type Base): the reference recording, base64-encoded "
        "(WAV, FLAC, any format libsndfile reads) or a data URI data:audio/...;base64,...; "
        "URLs are not fetched. Resampled to the model's rate; server.max_ref_audio_s and "
        "server.max_ref_audio_bytes bound it.",
    )
    ref_text: str | None = Field(
        None,
        description="Voice clone: the reference's transcript (in-context cloning; not used "
        "with x_vector_only_mode).",
    )
    x_vector_only_mode: bool | None = Field(
        None,
        strict=True,
        description="Voice clone from the reference's speaker embedding alone (no ref_text).",
    )

    @property
    def streaming(self) -> bool:
        """`stream`, or a `stream_format` without an explicit `stream: false`: vLLM-Omni's
        request model sends `stream: false` with `stream_format: "audio"` by default, and
        means a whole response (`"sse"` beside `stream: false` is refused: validation.py)."""
        if "stream" in self.model_fields_set and not self.stream:
            return False
        return self.stream or self.stream_format is not None


class VoiceBody(BaseModel):
    """`POST /v1/audio/voices`: a voice-clone reference to encode once and keep (Base models).

    The reference fields are the speech request's, checked the same way; the registered
    voice's id then stands for them as `voice` in speech requests."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "my voice",
                    "ref_audio": "data:audio/wav;base64,UklGR...",
                    "ref_text": "What the recording says.",
                }
            ]
        },
    )

    name: str = Field(min_length=1, max_length=256, description="A label for people.")
    ref_audio: str = Field(
        description="The reference recording, as the speech request's ref_audio takes it."
    )
    ref_text: str | None = Field(
        None, description="Its transcript (in-context cloning); none with x_vector_only_mode."
    )
    x_vector_only_mode: bool | None = Field(
        None, strict=True, description="Keep the speaker embedding alone (no ref_text)."
    )
