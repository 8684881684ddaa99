"""Modules made on torch's meta device: shapes without memory or values (the weights are
loaded or drawn afterwards, or only counted)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode


class _NoInit(TorchFunctionMode):
    """`torch.nn.init`'s fills skipped. On meta tensors they have no values to fill, and they
    run torch's reference ops, whose first use imports the compiler stack: about a second of
    every command that builds or sizes a model."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Modules created inside have meta parameters, never initialised."""
    with torch.device("meta"), _NoInit():
        yield
