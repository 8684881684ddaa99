"""The voice-clone contract: what a Base model's reference encoders make of a recording,
which a speech request carries and the server's voice registry keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class EncodedVoice(Protocol):
    """An encoded voice-clone reference: what a `SpeechRequest` carries for a Base model."""

    @property
    def ref_codes(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def speaker_embedding(self) -> tuple[float, ...]: ...


class ReferenceEncoder(Protocol):
    """A Base model's reference encoders (codec encoder + speaker encoder)."""

    def encode(self, audio: torch.Tensor) -> EncodedVoice:
        """Mono float32 samples at the codec's sample rate -> codes and embedding."""
        ...
