"""The request check of each stage component that takes the request's prompt, from the
model config alone: a command refuses a mistyped voice or language before it builds
anything (synth imports this only after its config checks, as it loads torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from omniflow.models.qwen3_tts.prompt_check import check_voice_and_language

if TYPE_CHECKING:
    from omniflow.models.shapes import ModelConfig

RequestCheck = Callable[["ModelConfig", "str | None", str], None]
"""(model config, preset voice or None, language) -> None; raises `ConfigError` keyed by the
request field at fault, from the model config alone (no weights), so a command refuses a
request before it builds anything."""

REQUEST_CHECKS: dict[str, RequestCheck] = {
    "qwen3_tts_talker": check_voice_and_language,
}
"""Only components that take the request's prompt have one."""


def request_check(arch: str) -> RequestCheck | None:
    """The request check of `arch` (None: it takes no prompt)."""
    return REQUEST_CHECKS.get(arch)
