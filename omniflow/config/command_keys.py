"""Which of the commands' own sections (server, synth, bench, deploy) each command reads.

Every command composes the whole configuration, so `omniflow synth server.port=9` would
validate and then be ignored: a key of a section the command does not read is refused,
naming the commands that do. The stage graph's sections (pipeline, model, platform) act in
every command; `omniflow config` prints any of these sections that an override names.
"""

from __future__ import annotations

from collections.abc import Sequence

from omniflow.config.commands import BenchConfig, SynthConfig
from omniflow.config.compose import override_key
from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.server import ServerConfig
from omniflow.errors import ConfigError

ALL = None
"""Every key of the section acts."""

BENCH_SERVER_FIXED = frozenset({"host", "port"})
"""The bench serves on a free loopback port."""

SYNTH_SERVER_KEYS = frozenset({"max_input_chars"})
"""synth checks its request by the server's rules; of the server's limits only this one
applies to one offline request."""

READS: dict[str, dict[str, frozenset[str] | None]] = {
    "serve": {"server": ALL, "deploy": ALL},
    "synth": {"synth": ALL, "server": SYNTH_SERVER_KEYS},
    "bench": {"bench": ALL, "server": ALL, "deploy": ALL},
    "config": {"server": ALL, "synth": ALL, "bench": ALL, "deploy": ALL},
}
"""Per command, the sections it reads and which of their keys (ALL: every one)."""

UNREAD: dict[tuple[str, str], frozenset[str]] = {("bench", "server"): BENCH_SERVER_FIXED}
"""Keys of a section a command reads that still do not act in it."""

SECTIONS = ("server", "synth", "bench", "deploy")
FIELDS = {
    "server": ServerConfig.model_fields,
    "synth": SynthConfig.model_fields,
    "bench": BenchConfig.model_fields,
    "deploy": DeployConfig.model_fields,
}
"""A key that is no field (a typo) is left to the schema, which suggests the nearest."""


def acts(command: str, key: str) -> bool:
    """Whether the key `section.name` (or the group `section`) acts in `command`."""
    section, _, name = key.partition(".")
    reads = READS.get(command, {})
    if section not in reads:
        return False
    keys = reads[section]
    leaf = name.partition(".")[0]
    if not leaf:
        return keys is ALL
    return (keys is ALL or leaf in keys) and leaf not in UNREAD.get((command, section), ())


def leaf_keys(item: str) -> list[str]:
    """The keys an override sets: its own, or for a whole section given as a mapping
    (`server={port:5}`), each key of it (`server.port`)."""
    key, _, value = item.partition("=")
    key = key.lstrip("+~")
    if "." in key or not value.lstrip().startswith("{"):
        return [key]
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides([item])[0].value()
    except HydraException:
        return [key]  # Hydra itself reports it when composing
    return [f"{key}.{name}" for name in parsed] if isinstance(parsed, dict) else [key]


def check_command_keys(command: str, overrides: Sequence[str]) -> None:
    """Refuse an override of a command section that `command` does not read."""
    for key in (leaf for item in overrides for leaf in leaf_keys(item)):
        section, _, name = key.partition(".")
        known = not name or name.partition(".")[0] in FIELDS.get(section, {})
        if section not in SECTIONS or not known or acts(command, key):
            continue
        readers = [c for c in READS if c != "config" and acts(c, key)]
        where = f"it acts in {' and '.join(f'`omniflow {c}`' for c in readers)}"
        if command == "bench" and section == "server":
            where = "the bench serves on a free loopback port of its own"
        elif command == "synth" and section == "server":
            where += "; synth reads server.max_input_chars alone"
        raise ConfigError(key, f"does not act in `omniflow {command}` ({where})")


def named_sections(overrides: Sequence[str]) -> list[str]:
    """The command sections `omniflow config` prints besides the graph: those overridden."""
    named = {override_key(item).partition(".")[0] for item in overrides}
    return [s for s in SECTIONS[:3] if s in named]
