"""Hydra composition -> validated `OmniflowSpec` (docs/architecture.md: configuration).

Hydra builds the config from `conf/` and the overrides; `OmegaConf.to_container` turns it
into plain data; pydantic validates it. After this point only frozen pydantic objects travel:
no DictConfig leaves this module. Every failure (unknown group option, bad override, schema
violation) becomes a `ConfigError` naming the key path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from omniflow.config.schema import STAGE_KINDS, OmniflowSpec
from omniflow.errors import ConfigError, ConfigErrors

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_cfg(overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> DictConfig:
    """Compose the raw Hydra config (for the CLI's multirun path and for tests)."""
    overrides = list(overrides)
    if config_dir is not None:
        extra = Path(config_dir).resolve()
        if not extra.is_dir():
            raise ConfigError("--config-dir", f"{config_dir} is not a directory")
        overrides.append(f"hydra.searchpath=[file://{extra}]")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError("", _one_line(str(exc))) from None


def validate(data: dict[str, Any]) -> OmniflowSpec:
    """Validate plain data into the spec; errors name their dotted key paths."""
    try:
        return OmniflowSpec.model_validate(data)
    except ValidationError as exc:
        errors = [ConfigError(_key_path(err["loc"]), err["msg"]) for err in exc.errors()]
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
    """Compose `conf/` with Hydra overrides and validate it."""
    return validate(to_data(compose_cfg(overrides, config_dir)))


def _key_path(loc: tuple[Any, ...]) -> str:
    """Dotted key path from a pydantic location, without the union's discriminator tag."""
    parts = [str(p) for p in loc]
    if len(parts) > 3 and parts[:2] == ["pipeline", "stages"] and parts[3] in STAGE_KINDS:
        del parts[3]
    return ".".join(parts)


def _one_line(text: str) -> str:
    """Hydra's messages span lines (hint, options); keep them all, on one line."""
    return " ".join(text.split())
