"""Checks a command makes before it builds anything heavy.

`omniflow config` only describes a configuration, so a graph for `platform=cuda` may be built
and printed on a laptop. The commands that run it (`serve`, `synth`, `bench`) first check what
the machine must have, so that a missing device, a busy port or too little memory is one line
and exit status 2, found in a second rather than after the model was built.

Memory (`check_memory`, the CPU platform): the build takes about its weights (parameters
counted from the preset's shapes, `build/checks.py`, times their dtype's size) plus each AR
stage's KV cache (`num_kv_blocks` x `block_size` tokens of K and V per layer), both allocated
and written at build time. That estimate is compared with the memory the machine has
available: `MemAvailable` in /proc/meminfo (else `os.sysconf`'s available pages), capped by
the cgroup's limit where one is set (a container). psutil is not a dependency.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from omniflow.config.graph import StageGraph
from omniflow.config.schema import SchedulerConfig
from omniflow.config.server import ServerConfig
from omniflow.errors import ConfigError

log = logging.getLogger(__name__)

LARGE_DUMMY_BYTES = 2**30
"""Above this estimate, dummy weights on the CPU need `model.allow_large_dummy=true`: only a
real-size preset without `model.path` gets there (the tiny presets take a few tens of MB), and
there it is random weights, seconds to minutes of build and gigabytes of memory for noise."""
RUNTIME_BYTES = 500 * 10**6
"""The process beside the weights and caches (torch, Python, activations), added to the
estimate: measured peaks of a tiny synth are ~60 MB, of the 1.7B preset's ~0.3 GB over its
weights and KV cache."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GB = 10**9


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
                raise ConfigError("server.port", reason) from None
            if exc.errno == errno.EADDRNOTAVAIL:  # the address is not one of this machine's
                raise ConfigError(
                    "server.host",
                    f"cannot bind {where}: {exc.strerror}; the host must be an address of this "
                    "machine (127.0.0.1, 0.0.0.0 for every interface, or one of its own)",
                ) from None
            key = "server.port" if exc.errno == errno.EACCES else "server.host"
            raise ConfigError(key, f"cannot bind {where}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a build takes on the host (the CPU platform)."""

    weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + RUNTIME_BYTES

    def describe(self) -> str:
        return (
            f"about {self.total / GB:.1f} GB of memory (weights {self.weights / GB:.1f} GB, "
            f"KV cache {self.kv_cache / GB:.1f} GB, runtime {RUNTIME_BYTES / GB:.1f} GB)"
        )


def memory_estimate(graph: StageGraph) -> MemoryEstimate:
    """What building `graph` takes: each part's parameters in the dtype it is built in (the
    talker in the model's, the codec decoder in `codec_dtype`, a Base model's encoders in
    fp32), and each AR stage's KV cache in the model's dtype."""
    from omniflow.build.checks import parameter_counts  # loads torch

    model = graph.model
    dtype = DTYPE_BYTES[model.dtype or graph.platform.dtype]
    counts = parameter_counts(model)
    weights = counts["lm"] * dtype + counts["codec"] * DTYPE_BYTES[graph.platform.codec_dtype]
    weights += counts.get("encoders", 0) * DTYPE_BYTES["float32"]
    t = model.talker
    kv = 0
    for stage in graph.stages.values():
        if isinstance(stage.scheduler, SchedulerConfig):
            tokens = (stage.scheduler.num_kv_blocks * stage.scheduler.block_size) + 1
            kv += tokens * t.num_layers * 2 * t.num_kv_heads * t.head_dim * dtype
    return MemoryEstimate(weights, kv)


def available_memory() -> tuple[int, str] | None:
    """Bytes this process may still take, and where that figure comes from (None: unknown)."""
    found: tuple[int, str] | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            found = pages, "available pages (sysconf)"
        except (OSError, ValueError, AttributeError):
            return None
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text())
        if limit != "max" and int(limit) - used < found[0]:
            found = int(limit) - used, "the cgroup's memory.max less memory.current"
    except (OSError, ValueError):
        pass
    return found


def check_memory(graph: StageGraph) -> MemoryEstimate | None:
    """On the CPU platform: a real-size preset without `model.path` (dummy weights over
    LARGE_DUMMY_BYTES) needs `model.allow_large_dummy=true`, and a build that would not fit
    the memory available is refused; a large one says what it takes before it starts. On
    another platform the weights and caches live on the device (None)."""
    if graph.platform.name != "cpu":
        return None
    model = graph.model
    need = memory_estimate(graph)
    if model.load == "dummy" and need.total > LARGE_DUMMY_BYTES and not model.allow_large_dummy:
        raise ConfigError(
            "model.path",
            f"unset, so model {model.name} would be built with random weights (noise, not "
            f"speech), taking {need.describe()} on the CPU; set model.path=DIR (a checkpoint) "
            "for speech, or model.allow_large_dummy=true to build the dummy anyway",
        )
    available = available_memory()
    if available is not None and need.total > available[0]:
        kv_keys = ", ".join(
            f"pipeline.stages.{s.name}.scheduler.num_kv_blocks={s.scheduler.num_kv_blocks}"
            for s in graph.stages.values()
            if isinstance(s.scheduler, SchedulerConfig)
        )
        raise ConfigError(
            "model",
            f"{model.name} on the CPU needs {need.describe()}, and {available[0] / GB:.1f} GB "
            f"is available ({available[1]}); lower the KV cache ({kv_keys}) or use a smaller "
            "model",
        )
    if need.total > LARGE_DUMMY_BYTES:
        log.info("building %s on the CPU: %s", model.name, need.describe())
    return need
