"""What each stage component supports, declared as data.

The config layer reads these values to accept or refuse a topology at build time, and the
engine reads them instead of probing model objects (`hasattr`/`getattr` with defaults are
not used anywhere for optional behaviour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StageKind = Literal["ar", "generation"]
Payload = Literal["text", "codes", "audio"]


@dataclass(frozen=True)
class ModelCapabilities:
    """Declared abilities of one stage component (one registry entry)."""

    family: str
    """Model family the component belongs to (must match the model preset's family)."""
    stage_kind: StageKind
    """The stage kind that can host it."""
    output: Payload
    """What the component emits per step without stream decode."""
    accepts: Payload | None
    """What it receives from an upstream stage (None: it takes the request prompt)."""
    supports_window: bool
    """Whether the runner may replay K decode steps inside one execute."""
    supports_stream_decode: bool
    """Whether it can own the streaming codec decoder and emit PCM."""
    decodes_audio: bool
    """Whether it runs a codec decoder (so `ref_context_frames` may apply to it)."""
    accepts_reference: bool
    """Whether the component primes its decoder with a request's reference codes (voice
    clone). Without it, or on a CustomVoice model, `ref_context_frames` has nothing to act
    on and is refused."""


ARCH_CAPABILITIES: dict[str, ModelCapabilities] = {
    "qwen3_tts_talker": ModelCapabilities(
        family="qwen3_tts",
        stage_kind="ar",
        output="codes",
        accepts=None,
        supports_window=True,
        supports_stream_decode=True,
        decodes_audio=False,
        accepts_reference=True,
    ),
    "qwen3_tts_code2wav": ModelCapabilities(
        family="qwen3_tts",
        stage_kind="generation",
        output="audio",
        accepts="codes",
        supports_window=False,
        supports_stream_decode=False,
        decodes_audio=True,
        accepts_reference=True,
    ),
}
"""Every stage component (`arch`) by name, as data: the config layer checks a topology
against it without importing a model, and `build/registry.py` maps the same names to the
functions that build them."""


def capabilities(arch: str) -> ModelCapabilities:
    """The declared capabilities of `arch`; KeyError lists the known names."""
    try:
        return ARCH_CAPABILITIES[arch]
    except KeyError:
        raise KeyError(f"unknown arch {arch!r}; known: {sorted(ARCH_CAPABILITIES)}") from None
