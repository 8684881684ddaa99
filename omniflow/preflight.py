"""Checks a command makes before it builds anything heavy.

`omniflow config` only describes a configuration, so a graph for `platform=cuda` may be built
and printed on a laptop. The commands that run it (`serve`, `synth`, `bench`) first check what
the machine must have, so that a missing device or a busy port is one line and exit status 2,
found in a second rather than after the model was built.
"""

from __future__ import annotations

import errno
import socket

from omniflow.config.graph import StageGraph
from omniflow.config.server import ServerConfig
from omniflow.errors import ConfigError


def check_device(graph: StageGraph) -> None:
    """The graph's platform has the device it names."""
    platform = graph.platform
    if platform.name != "cuda":
        return  # cpu is always there; npu is checked when the graph is built (torch_npu)
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise ConfigError(
            "platform.name",
            f"platform 'cuda' needs a CUDA GPU, and torch {torch.__version__} ({build}) sees "
            "none; use platform=cpu (or platform=auto, which picks cpu here)",
        )


def check_port(server: ServerConfig) -> None:
    """`server.host:server.port` can be bound now, with the options the server binds it
    with (SO_REUSEADDR: a port left in TIME_WAIT is free, one with a listener is not)."""
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((server.host, server.port))
        except socket.gaierror as exc:
            raise ConfigError("server.host", f"{server.host!r}: {exc.strerror}") from None
        except OSError as exc:
            where = f"{server.host}:{server.port}"
            if exc.errno == errno.EADDRINUSE:
                reason = f"{where} is already in use; stop what listens there or pick server.port=N"
            else:
                reason = f"cannot bind {where}: {exc.strerror or exc}"
            raise ConfigError("server.port", reason) from None
