"""Errors that cross module boundaries.

`ConfigError` is the only error a user sees for a bad configuration: it always names the key
path (dotted, as written in YAML or on the command line) and the rule that was broken, so the
CLI can print it without a traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration: `key` is the dotted key path, `reason` the broken rule."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}" if key else reason)


class ConfigErrors(ConfigError):
    """Several configuration errors found in one validation pass (all reported at once)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        ValueError.__init__(self, f"{len(errors)} configuration errors:\n{lines}")
        self.key = errors[0].key
        self.reason = errors[0].reason
