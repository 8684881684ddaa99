"""The voice registry of a Base model (`/v1/audio/voices`): a reference recording encoded
once and kept as its codes and speaker embedding, under an id that speech requests name as
`voice` (README, "Voice clone").

Why: encoding a reference (the codec encoder and the speaker encoder, on the CPU) costs
tens of milliseconds to seconds per request; a client speaking many texts in one cloned
voice pays it once. The registry keeps the encoders' outputs, never the audio, and a
registration goes through the speech request's own decoding, limits and encoding (the
server's `encode` callable, on a worker thread).

Bounded by `server.max_voices`, and full means full: a registration past it is a 409 until a
voice is deleted. Not LRU: an id a client holds must not stop working because other clients
registered voices since (its next request would fail far from the cause). A request already
running keeps its copy of the codes when its voice is deleted. The registry lives in the
server process: a restart forgets it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from omniflow.config.server import ServerConfig
from omniflow.core.pipeline import PipelineInfo
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import EncodedVoice
from omniflow.serve.compat import check_ref_text
from omniflow.serve.errors import ApiError, quoted
from omniflow.serve.protocol import SpeechBody, VoiceBody
from omniflow.serve.reference_gate import Place
from omniflow.serve.text import check_printable, check_speakable

Encode = Callable[[str, Place], Awaitable[EncodedVoice]]
"""`ref_audio` (base64 or data URI), the request's place in the reference gate -> the
encoded reference; ApiError 400 on bad audio, 429 when no place is free."""


@dataclass(frozen=True)
class Clone:
    """What a voice-clone speech request carries: the speaker embedding, and for an
    in-context clone the reference codes with their transcript (None: embedding only)."""

    speaker_embedding: tuple[float, ...]
    ref_codes: tuple[tuple[int, ...], ...] | None
    ref_text: str | None

    @classmethod
    def of(cls, voice: EncodedVoice, ref_text: str | None, x_vector_only: bool) -> Clone:
        if x_vector_only:
            return cls(voice.speaker_embedding, None, None)
        return cls(voice.speaker_embedding, voice.ref_codes, ref_text)


def speech_request(
    body: SpeechBody, clone: Clone | None, id_prefix: str = "speech", incremental: bool = False
) -> SpeechRequest:
    """The request a checked speech body asks for, `clone` its voice clone (then `voice`
    named none, or the registered voice it came from). The server and `synth` (one request
    or a batch's lines) build theirs here, so a body means the same request everywhere."""
    return SpeechRequest.create(
        body.input,
        id_prefix=id_prefix,
        voice=None if clone is not None else body.voice,
        language=body.language,
        seed=body.seed,
        max_new_tokens=body.max_new_tokens,
        ignore_eos=body.ignore_eos,
        instructions=body.instructions,
        initial_chunk_frames=body.initial_chunk_frames,
        non_streaming_mode=body.non_streaming_mode,
        speaker_embedding=clone.speaker_embedding if clone is not None else None,
        ref_codes=clone.ref_codes if clone is not None else None,
        ref_text=clone.ref_text if clone is not None else None,
        incremental=incremental,
    )


@dataclass(frozen=True)
class RegisteredVoice:
    id: str
    name: str
    created_at: int
    clone: Clone

    def card(self) -> dict:
        """The voice as the API shows it (never its codes or embedding)."""
        return {
            "id": self.id,
            "object": "audio.voice",
            "name": self.name,
            "created_at": self.created_at,
            "x_vector_only_mode": self.clone.ref_codes is None,
            "ref_frames": len(self.clone.ref_codes or ()),
        }


class RegistryFull(Exception):
    """The registry holds `capacity` voices."""


class VoiceRegistry:
    """At most `capacity` voices by id, in registration order; thread-safe. A registration
    reserves its place before its reference is encoded, so registrations racing for the
    last place cost one encoding, not one each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._voices: dict[str, RegisteredVoice] = {}
        self._reserved = 0
        self._lock = threading.Lock()

    def reserve(self) -> None:
        """Hold a place for a voice being encoded; RegistryFull when none is left."""
        with self._lock:
            if len(self._voices) + self._reserved >= self.capacity:
                raise RegistryFull
            self._reserved += 1

    def add(self, name: str, clone: Clone) -> RegisteredVoice:
        """Fill a reserved place."""
        voice = RegisteredVoice("voice_" + secrets.token_hex(12), name, int(time.time()), clone)
        with self._lock:
            self._reserved -= 1
            self._voices[voice.id] = voice
        return voice

    def cancel(self) -> None:
        """Free a reserved place (its encoding failed)."""
        with self._lock:
            self._reserved -= 1

    def get(self, voice_id: str) -> RegisteredVoice | None:
        with self._lock:
            return self._voices.get(voice_id)

    def remove(self, voice_id: str) -> bool:
        with self._lock:
            return self._voices.pop(voice_id, None) is not None

    def voices(self) -> list[RegisteredVoice]:
        with self._lock:
            return list(self._voices.values())


class VoiceService:
    """The voices a served model takes as `voice`, and the registry's endpoints.

    A CustomVoice model (`encode` None) offers its preset speakers and registers nothing. A
    Base model has no preset speakers (a dummy-weight Base preset still carries the default
    speaker table, which its prompts never use): it offers its registered voices only."""

    def __init__(self, info: PipelineInfo, server: ServerConfig, encode: Encode | None) -> None:
        self.info = info
        self.server = server
        self.encode = encode
        self.registry = VoiceRegistry(server.max_voices)

    def listing(self) -> dict:
        """GET /v1/audio/voices: `voices` is what a speech request may name as `voice`."""
        body: dict = {
            "languages": list(self.info.languages),
            "task_types": list(self.info.task_types),
        }
        if self.encode is None:
            return {"voices": list(self.info.voices), **body}
        registered = self.registry.voices()
        return {
            "voices": [v.id for v in registered],
            **body,
            "registered": [v.card() for v in registered],
            "max_voices": self.registry.capacity,
        }

    def saved(self, body: SpeechBody) -> Clone | None:
        """The registered voice a voice-clone request names, if it names one."""
        if body.task_type != "Base" or body.voice is None:
            return None
        voice = self.registry.get(body.voice)
        return voice.clone if voice is not None else None

    async def create(self, body: VoiceBody, place: Place) -> RegisteredVoice:
        """Check, reserve a place (a full registry costs no encoding), encode (once, off
        the event loop, within the request's `place` in the reference gate), keep."""
        if self.encode is None:
            raise ApiError(
                400,
                f"model {self.info.model} does not support voice cloning: registering a "
                "voice needs a Base model",
            )
        check_printable(body.name, "name")
        self._check_ref_text(body)
        try:
            self.registry.reserve()
        except RegistryFull:
            raise self._full() from None
        added = None
        try:
            voice = await self.encode(body.ref_audio, place)
            clone = Clone.of(voice, body.ref_text, bool(body.x_vector_only_mode))
            added = self.registry.add(body.name, clone)
            return added
        finally:
            if added is None:  # a bad reference, or the client left while it encoded
                self.registry.cancel()

    def card(self, voice_id: str) -> dict:
        voice = self.registry.get(voice_id)
        if voice is None:
            raise self._unknown(voice_id)
        return voice.card()

    def delete(self, voice_id: str) -> dict:
        if not self.registry.remove(voice_id):
            raise self._unknown(voice_id)
        return {"id": voice_id, "object": "audio.voice.deleted", "deleted": True}

    def _check_ref_text(self, body: VoiceBody) -> None:
        """The speech request's rules (compat.py): a transcript for an in-context clone,
        none with x_vector_only_mode; a transcript within the input limit and speakable."""
        check_ref_text(
            body.x_vector_only_mode,
            body.ref_text,
            "an in-context voice needs ref_text (the reference's transcript); or set "
            "x_vector_only_mode to keep the speaker embedding alone",
        )
        if body.ref_text is None:  # x_vector_only_mode: no transcript to check
            return
        if len(body.ref_text) > self.server.max_input_chars:
            raise ApiError(
                400,
                f"ref_text is longer than {self.server.max_input_chars} characters",
                "ref_text",
            )
        check_speakable(body.ref_text, "ref_text")

    def _full(self) -> ApiError:
        n = self.registry.capacity
        return ApiError(
            409,
            f"the voice registry is full: it holds {n} voices (server.max_voices = {n}); "
            "delete one (DELETE /v1/audio/voices/{id}) first",
            None,
        )

    @staticmethod
    def _unknown(voice_id: str) -> ApiError:
        return ApiError(
            404,
            f"no registered voice {quoted(voice_id)} (GET /v1/audio/voices lists them)",
            "voice_id",
            "not_found_error",
        )
