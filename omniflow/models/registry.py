"""Stage components by registry name.

A stage names its component (`arch: qwen3_tts_talker`); the registry maps that name to the
component's declared capabilities (readable without importing torch: the config layer checks
a topology against them) and to the builder that turns a resolved stage into its scheduler
and runner. Builders live in `omniflow/stages/` (they wire schedulers to models, which
`models/` must not import), so an entry names its builder as `module:function`, imported on
first use; `omniflow.stages.build` is the only caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniflow.models.capabilities import ModelCapabilities


@dataclass(frozen=True)
class ArchEntry:
    """One stage component: what it can do, and what builds it."""

    capabilities: ModelCapabilities
    builder: str
    """`module:function` of the stage builder (see `omniflow.stages.builders.StageBuilder`)."""


ARCHS: dict[str, ArchEntry] = {
    "qwen3_tts_talker": ArchEntry(
        ModelCapabilities(
            family="qwen3_tts",
            stage_kind="ar",
            output="codes",
            accepts=None,
            supports_window=True,
            supports_stream_decode=True,
            decodes_audio=False,
            accepts_reference=True,
        ),
        builder="omniflow.stages.qwen3_tts:build_talker_stage",
    ),
    "qwen3_tts_code2wav": ArchEntry(
        ModelCapabilities(
            family="qwen3_tts",
            stage_kind="generation",
            output="audio",
            accepts="codes",
            supports_window=False,
            supports_stream_decode=False,
            decodes_audio=True,
            accepts_reference=True,
        ),
        builder="omniflow.stages.qwen3_tts:build_code2wav_stage",
    ),
}


def capabilities(arch: str) -> ModelCapabilities:
    """The declared capabilities of `arch`; KeyError lists the known names."""
    try:
        return ARCHS[arch].capabilities
    except KeyError:
        raise KeyError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}") from None
