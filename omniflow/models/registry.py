"""Stage components by registry name.

A stage names its component (`arch: qwen3_tts_talker`); the registry maps that name to the
component's declared capabilities (readable without importing torch) and, for the engine, to
the builder. Builders are imported on first use so the config layer stays light.
"""

from __future__ import annotations

from omniflow.models.capabilities import ModelCapabilities

ARCHS: dict[str, ModelCapabilities] = {
    "qwen3_tts_talker": ModelCapabilities(
        family="qwen3_tts",
        stage_kind="ar",
        output="codes",
        accepts=None,
        supports_window=True,
        supports_stream_decode=True,
        decodes_audio=False,
    ),
    "qwen3_tts_code2wav": ModelCapabilities(
        family="qwen3_tts",
        stage_kind="generation",
        output="audio",
        accepts="codes",
        supports_window=False,
        supports_stream_decode=False,
        decodes_audio=True,
    ),
}


def capabilities(arch: str) -> ModelCapabilities:
    """The declared capabilities of `arch`; KeyError lists the known names."""
    try:
        return ARCHS[arch]
    except KeyError:
        raise KeyError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}") from None
