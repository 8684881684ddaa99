"""Hydra composition -> validated `OmniflowSpec` (docs/architecture.md: configuration).

Hydra builds the config from `omniflow/conf/` (shipped inside the package, so an installed
omniflow has it) and the overrides; `OmegaConf.to_container` turns it into plain data;
pydantic validates it. After this point only frozen pydantic objects travel: no DictConfig
leaves this module. Every failure (unknown group option, bad override, schema
violation) becomes a `ConfigError` naming the key path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from omniflow.config.schema import STAGE_KINDS, OmniflowSpec
from omniflow.config.suggest import hint_for_field, hint_for_key, hint_for_option
from omniflow.core.capabilities import ARCH_CAPABILITIES
from omniflow.errors import ConfigError, ConfigErrors

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_cfg(overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> DictConfig:
    """Compose the raw Hydra config (for the CLI's multirun path and for tests)."""
    dirs = search_dirs(config_dir)
    refuse_printed_only(overrides)
    refuse_unset_groups(overrides, dirs)
    overrides = plus_sets(overrides)
    try:
        return _hydra_compose(list(overrides), dirs)
    except (HydraException, OmegaConfBaseException) as exc:
        message = _one_line(str(exc)).split(" Config search path:")[0]
        hint = _hint(list(overrides), dirs)
        # Hydra's "To append to your config use +key=value" invites the typo in: the YAML
        # lists every key (a map's own entries aside, `plus_sets`), so `+` adds nothing valid
        message = re.sub(r"\. To append to your config use \S+", ": no such key", message)
        raise ConfigError("", message + hint) from None


DERIVED = {
    "final_stage": "the stage no other stage's upstream names; set pipeline.stages.NAME.upstream",
    "platform.device": "it follows platform.name (and platform.device_index on npu); set those",
}
"""Keys `omniflow config` prints that are derived from others, and what to set instead."""
STAGE_DERIVED = {
    "name": "it is the stage's key in pipeline.stages: rename the stage's key",
    "receives_chunks": "it follows the stage's upstream; set pipeline.stages.NAME.upstream",
    "atomic_chunks": "it follows the stage's upstream; set pipeline.stages.NAME.upstream",
    "output": "it follows the stage's arch and stream_decode; set those",
    "downstream": "it follows the other stages' upstream; set pipeline.stages.NAME.upstream",
    "is_final": "the final stage is the one no upstream names; set pipeline.stages.*.upstream",
}
"""The same for each stage's keys."""
PRINTED_AT_TOP = ("stages", "runtime")
"""Keys `omniflow config` prints at its top that are set under `pipeline.`."""


FREE_MAPS = ("deploy.resources_per_replica.",)
"""Maps whose keys are the user's own names (Ray resources): `omniflow config` prints their
entries as keys (`deploy.resources_per_replica.CPU`), and an entry is set as printed though
the YAML's null has none."""


def override_key(item: str) -> str:
    """The dotted key an override sets (`+a.b=1`, `~a.b`, `a=x` -> `a.b`, `a.b`, `a`)."""
    return item.partition("=")[0].lstrip("+~")


def plus_sets(overrides: Sequence[str]) -> list[str]:
    """`+a.b=v` as Hydra's `++a.b=v` (set it, added or not): the shipped YAML lists every key,
    so a key that once had to be added with `+` (`+platform.cuda_graphs=false`) still works
    as written; so does an entry of a `FREE_MAPS` map, with or without `+`. A group choice
    (`+experiment=x`, no dot) keeps its `+`."""
    out = []
    for o in overrides:
        key = o.split("=")[0]
        if o.startswith("+") and not o.startswith("++") and "." in key:
            o = "+" + o
        elif key.startswith(FREE_MAPS) and "=" in o:
            o = "++" + o
        out.append(o)
    return out


def refuse_printed_only(overrides: Sequence[str]) -> None:
    """A key `omniflow config` prints but that is not set as printed (a derived one, or the
    stages and runtime, printed at the top and set under `pipeline.`): refused naming what
    to set, where Hydra would say only that the key is not in the config."""
    for item in overrides:
        key = override_key(item)
        if "@" in key or "=" not in item:
            continue
        parts = key.split(".")
        stage = key.startswith("pipeline.stages.") and len(parts) == 4
        top = key.removeprefix("pipeline.")  # printed at the top, looked for under pipeline
        if top in DERIVED or (stage and parts[3] in STAGE_DERIVED):
            why = DERIVED[top] if top in DERIVED else STAGE_DERIVED[parts[3]]
            raise ConfigError(key, f"omniflow config prints it, but it is derived, not set: {why}")
        if parts[0] in PRINTED_AT_TOP:
            raise ConfigError(
                key,
                f"omniflow config prints {parts[0]} at its top, but it is set under pipeline: "
                f"pipeline.{key}",
            )


SHADOWED_BY = {"platform.dtype": "model.dtype", "platform.codec_dtype": "model.codec_dtype"}
"""A platform key the model's key wins over when set (the model's precision, else the
platform's): both set to different values, the platform's would be ignored."""


def refuse_shadowed(data: dict[str, Any], overrides: Sequence[str]) -> None:
    """Refuse a platform key set on the command line that the composed model key wins over
    with another value (set there too, or by an overlay)."""
    given = {override_key(o) for o in overrides}
    for key, winner in SHADOWED_BY.items():
        section, name = key.split(".")
        mine = data.get(section, {}).get(name)
        theirs = data.get(winner.split(".")[0], {}).get(name)
        if key in given and theirs is not None and theirs != mine:
            raise ConfigError(
                key,
                f"{key}={mine} would not act: {winner}={theirs} wins over it (the model's "
                f"precision where set, else the platform's); set one of them",
            )


def refuse_unset_groups(overrides: Sequence[str], dirs: Sequence[Path]) -> None:
    """`experiment=null` or `~experiment`: a config group named without an option, which
    Hydra answers with a traceback (null) or a failed interpolation (a pipeline's defaults
    name the experiment); refused naming the options, none being the default's absence."""
    for item in overrides:
        key, eq, value = item.partition("=")
        name = key.lstrip("+~")
        options = sorted({p.stem for d in dirs for p in (d / name).glob("*.yaml")})
        if not options or not (key.startswith("~") or (eq and value in ("null", "None", ""))):
            continue
        raise ConfigError(
            name,
            f"{item}: a config group takes one of its options ({', '.join(options)}); "
            "to use none of an optional one (experiment), leave it out",
        )


def search_dirs(config_dir: str | Path | None) -> list[Path]:
    """The shipped config directory, then the user's `--config-dir` (checked)."""
    if config_dir is None:
        return [CONF_DIR]
    extra = Path(config_dir).resolve()
    if not extra.is_dir():
        raise ConfigError("--config-dir", f"{config_dir} is not a directory")
    return [CONF_DIR, extra]


def _hydra_compose(overrides: list[str], dirs: list[Path]) -> DictConfig:
    extra = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in dirs[1:])}]"] * (len(dirs) > 1)
    with initialize_config_dir(config_dir=str(dirs[0]), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides + extra)


def _hint(overrides: list[str], dirs: list[Path]) -> str:
    """A did-you-mean for the first mistyped key or group option among `overrides`, looked
    up in the config composed from the group choices that do exist."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return ""
    groups = {p.name for d in dirs for p in d.iterdir() if p.is_dir()}
    chosen, keys = [], []
    for o in parsed:
        if o.key_or_group in groups and o.package is None and isinstance(o.value(), str):
            option = str(o.value())
            if any((d / o.key_or_group / f"{option}.yaml").is_file() for d in dirs):
                chosen.append(o.input_line)
            else:
                return hint_for_option(o.key_or_group, option, dirs)
        elif not o.is_add() and not o.is_force_add():
            keys.append(o.key_or_group)
    try:
        data = OmegaConf.to_container(_hydra_compose(chosen, dirs), resolve=False)
    except (HydraException, OmegaConfBaseException):
        return ""
    assert isinstance(data, dict)
    return next((h for h in (hint_for_key(k, data) for k in keys) if h), "")


def validate(data: dict[str, Any]) -> OmniflowSpec:
    """Validate plain data into the spec; errors name their dotted key paths."""
    try:
        return OmniflowSpec.model_validate(data)
    except ValidationError as exc:
        errors = [_error(err, data) for err in exc.errors()]
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None


def to_data(cfg: DictConfig) -> dict[str, Any]:
    """Resolve interpolations and drop Hydra's own node."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise ConfigError("", _one_line(str(exc))) from None
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return data  # type: ignore[return-value]


def compose(overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> OmniflowSpec:
    """Compose `omniflow/conf/` with Hydra overrides and validate it."""
    data = to_data(compose_cfg(overrides, config_dir))
    refuse_shadowed(data, overrides)
    foreign = foreign_kinds(data, overrides)
    try:
        spec = validate(data)
    except ConfigError as exc:
        if not foreign:
            raise
        more = exc.errors if isinstance(exc, ConfigErrors) else [exc]
        raise ConfigErrors([*foreign, *more]) from None
    if foreign:
        raise foreign[0] if len(foreign) == 1 else ConfigErrors(foreign)
    return spec


def foreign_kinds(data: dict[str, Any], overrides: Sequence[str]) -> list[ConfigError]:
    """A stage's `kind` overridden to another than its arch's: one error each, and the stage
    validated as its arch's kind (the other kind's schema would refuse each of the stage's
    keys it lacks: ten lines for the talker), so the command's other errors come with it.
    (An overridden `arch` of another kind is the build rules' one line.)"""
    stages = data.get("pipeline", {}).get("stages") or {}
    set_kinds = {
        k.split(".")[2]
        for k in map(override_key, overrides)
        if k.startswith("pipeline.stages.") and k.endswith(".kind") and k.count(".") == 3
    }
    errors = []
    for name, stage in stages.items() if isinstance(stages, dict) else ():
        if name not in set_kinds:
            continue
        cap = ARCH_CAPABILITIES.get(stage.get("arch")) if isinstance(stage, dict) else None
        if cap is not None and stage.get("kind") not in (None, cap.stage_kind):
            errors.append(
                ConfigError(
                    f"pipeline.stages.{name}.kind",
                    f"{stage['kind']!r}: arch {stage['arch']!r} runs in stages of kind "
                    f"{cap.stage_kind!r} (a stage's kind follows its arch); set "
                    f"pipeline.stages.{name}.arch",
                )
            )
            stage["kind"] = cap.stage_kind
    return errors


def _error(err: ErrorDetails, data: dict[str, Any]) -> ConfigError:
    key = _key_path(err["loc"])
    parts = key.split(".")
    if err["type"] == "union_tag_not_found" and parts[:2] == ["pipeline", "stages"]:
        return ConfigError(key, _no_such_stage(parts[2], data))
    hint = hint_for_field(key, data) if err["type"] == "extra_forbidden" else ""
    return ConfigError(key, err["msg"] + hint)


def _no_such_stage(name: str, data: dict[str, Any]) -> str:
    """A stage key added with `+` that names no stage of the pipeline (no `kind`)."""
    pipeline = data.get("pipeline", {})
    stages = [s for s in pipeline.get("stages", {}) if s != name]
    return (
        f"pipeline {pipeline.get('name')} has no stage {name!r} (its stages: "
        f"{', '.join(stages)}); a new stage states its kind (ar or generation), arch and "
        "upstream, or choose a pipeline that has it"
    )


def _key_path(loc: tuple[Any, ...]) -> str:
    """Dotted key path from a pydantic location, without the union's discriminator tag."""
    parts = [str(p) for p in loc]
    if len(parts) > 3 and parts[:2] == ["pipeline", "stages"] and parts[3] in STAGE_KINDS:
        del parts[3]
    return ".".join(parts)


def _one_line(text: str) -> str:
    """Hydra's messages span lines (hint, options); keep them all, on one line."""
    return " ".join(text.split())
