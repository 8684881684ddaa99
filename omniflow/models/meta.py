"""Modules made on torch's meta device: shapes without memory or values (the weights are
loaded or drawn afterwards, or only counted)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

_INIT_FILLS = frozenset(
    f for name, f in vars(torch.nn.init).items() if name.endswith("_") and callable(f)
)
"""`torch.nn.init`'s in-place fills (`normal_`, `kaiming_uniform_`, ...)."""


class _NoInit(TorchFunctionMode):
    """`torch.nn.init`'s fills skipped. On meta tensors they have no values to fill, and they
    run torch's reference ops, whose first use imports the compiler stack: about a second of
    every command that builds or sizes a model."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INIT_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Modules created inside have meta parameters, never initialised."""
    with torch.device("meta"), _NoInit():
        yield


def materialize(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module`'s meta parameters as uninitialised memory on `device`, shared ones still
    shared; buffers are left as they are (make such modules without them). Why not
    `Module.to_empty`: its `empty_like` takes torch's reference path for meta tensors,
    which imports the symbolic-shape machinery (a third of a second)."""
    made: dict[int, torch.nn.Parameter] = {}
    for owner in module.modules():
        for name, p in list(owner.named_parameters(recurse=False, remove_duplicate=False)):
            if id(p) not in made:
                data = torch.empty(p.shape, dtype=p.dtype, device=device)
                made[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
            setattr(owner, name, made[id(p)])
    return module
