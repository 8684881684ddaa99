"""The `deploy` config group's schema (`deploy=local` | `deploy=ray`, docs/deploy.md): each
key validated alone here, against the platform in omniflow/deploy/settings.py. Kept out of
config/schema.py, which holds it in `OmniflowSpec`, so that file stays readable."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from omniflow.core.frozen import Frozen

_RAY_ADDRESS = re.compile(r"ray://[^\s:/]+:\d{1,5}")


class DeployConfig(Frozen):
    """Where `omniflow serve` runs the pipeline: `local`, beside the server (in its process,
    or in an engine process of its own: `pipeline.runtime`); `ray`, as
    replicas of the whole pipeline behind Ray Serve (docs/deploy.md). The cross-field rules
    (resources against the platform) are in omniflow/deploy/settings.py."""

    name: Literal["local", "ray"] = Field("local", description="local or ray.")
    replicas: int = Field(
        1, ge=1, le=1024, description="ray: copies of the whole pipeline behind the one API."
    )
    resources_per_replica: dict[str, float] | None = Field(
        None,
        description="ray: the Ray resources each replica holds, e.g. {CPU: 1} or {GPU: 1}; "
        "null: {CPU: 1} on the cpu platform, {GPU: 1} on cuda.",
    )
    address: str | None = Field(
        None,
        description="ray: null starts a local Ray cluster; `auto` or `ray://host:port` joins one.",
    )
    router: Literal["least_loaded", "default"] = Field(
        "least_loaded",
        description="ray: which replica takes a request. least_loaded: the most free seats, "
        "then fewest in-flight streams, by each replica's gauges (omniflow/deploy/router.py); "
        "default: Ray Serve's power of two choices.",
    )

    @field_validator("resources_per_replica")
    @classmethod
    def _resources(
        cls, value: dict[str, float] | None, info: ValidationInfo
    ) -> dict[str, float] | None:
        _ray_only(value, None, info)
        for key, amount in (value or {}).items():
            if not key.strip():
                raise _invalid("a resource needs a name (CPU, GPU, memory or a custom one)")
            if amount < 0:
                raise _invalid(f"{key}: {amount:g} is negative; a replica holds 0 or more")
        if value is not None and not any(value.values()):
            raise _invalid("holds nothing: give a replica at least one resource, e.g. {CPU: 1}")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None, info: ValidationInfo) -> str | None:
        _ray_only(value, None, info)
        if value is None or value == "auto" or _RAY_ADDRESS.fullmatch(value):
            return value
        raise _invalid(
            f"{value!r}: null (start a local cluster), auto (the cluster this machine is in) "
            "or ray://host:port (a Ray client address)"
        )

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int, info: ValidationInfo) -> int:
        _ray_only(value, 1, info)
        return value

    @field_validator("router")
    @classmethod
    def _router(cls, value: str, info: ValidationInfo) -> str:
        _ray_only(value, "least_loaded", info)
        return value


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("deploy", message)


def _ray_only(value: object, default: object, info: ValidationInfo) -> None:
    """A deploy key set away from its default acts only with deploy=ray."""
    if value != default and info.data.get("name") == "local":
        raise _invalid("acts only with deploy=ray (add deploy=ray); deploy=local ignores it")
