"""What builds each stage component (`arch`): plain imports, so a reader (or a tool) can
follow every name to its function.

The capabilities of the same names are data in `core/capabilities.py` and the request checks
are in `build/checks.py` (importable before torch); a test keeps the tables' keys in step.
"""

from __future__ import annotations

from omniflow.build.context import StageBuilder
from omniflow.build.qwen3_tts import build_code2wav_stage, build_talker_stage
from omniflow.core.capabilities import ARCH_CAPABILITIES

BUILDERS: dict[str, StageBuilder] = {
    "qwen3_tts_talker": build_talker_stage,
    "qwen3_tts_code2wav": build_code2wav_stage,
}


def builder(arch: str) -> StageBuilder:
    """The builder of `arch`; KeyError lists the known names."""
    try:
        return BUILDERS[arch]
    except KeyError:
        raise KeyError(f"unknown arch {arch!r}; known: {sorted(ARCH_CAPABILITIES)}") from None
