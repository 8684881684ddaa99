"""The base of every typed config model, shared by the config schema and the model shapes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Dtype = Literal["float32", "bfloat16", "float16"]


class Frozen(BaseModel):
    """Base for every config model: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")
