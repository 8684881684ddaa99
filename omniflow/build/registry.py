"""Stage components by registry name.

A stage names its component (`arch: qwen3_tts_talker`); the registry maps that name to the
component's declared capabilities (readable without importing torch: the config layer checks
a topology against them) and to the builder that turns a resolved stage into its scheduler
and runner. Builders live in `omniflow/stages/` (they wire schedulers to models, which
`models/` must not import), so an entry names its builder as `module:function`, imported on
first use; `omniflow.build.pipeline` is the only caller.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omniflow.core.capabilities import ModelCapabilities

if TYPE_CHECKING:
    from omniflow.config.schema import ModelConfig

RequestCheck = Callable[["ModelConfig", "str | None", str], None]
"""(model config, preset voice or None, language) -> None; raises `ConfigError` keyed by the
request field at fault."""


@dataclass(frozen=True)
class ArchEntry:
    """One stage component: what it can do, and what builds it."""

    capabilities: ModelCapabilities
    builder: str
    """`module:function` of the stage builder (see `omniflow.build.context.StageBuilder`)."""
    request_check: str | None = None
    """For a component that takes the request's prompt: `module:function(model, voice,
    language)` raising `ConfigError` keyed by the field a request may not carry, from the
    model config alone (no weights), so a command refuses it before it builds anything."""


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
        builder="omniflow.build.qwen3_tts:build_talker_stage",
        request_check="omniflow.models.qwen3_tts.prompt_check:check_voice_and_language",
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
        builder="omniflow.build.qwen3_tts:build_code2wav_stage",
    ),
}


def import_target(target: str) -> object:
    """The function a registry entry names as `module:function`, imported on first use."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def load_request_check(arch: str) -> RequestCheck | None:
    """Import the request check the registry names for `arch` (None: it has none)."""
    target = ARCHS[arch].request_check
    if target is None:
        return None
    check: RequestCheck = import_target(target)  # type: ignore[assignment]
    return check


def capabilities(arch: str) -> ModelCapabilities:
    """The declared capabilities of `arch`; KeyError lists the known names."""
    try:
        return ARCHS[arch].capabilities
    except KeyError:
        raise KeyError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}") from None
