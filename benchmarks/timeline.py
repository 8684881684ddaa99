"""Is a stage host-bound? The engine's phases as profiler ranges (no device syncs), and a
summary of a profiler trace: how long the GPU was busy against the wall time, and how much
host time each phase took.

Why: `benchmarks.talker_baseline` synchronises the device around every phase, so its phases are
exact but the step is serialised (host, then device, then host). Served, the host queues a
step's work while the GPU runs the previous one; whether the GPU then waits for the host is
read off a timeline: `RangeTimer` marks each phase as a `torch.profiler.record_function`
range (host only, nothing synchronised), and `summarize` reads the exported chrome trace:
- `wall_ms`: first to last piece of device work (0 on the CPU, which runs no kernels);
- `gpu_busy_ms`: the union of the kernels', copies' and fills' intervals (several streams
  count once);
- `host_ms`: per phase, the summed duration of its ranges (a window's `decode_step`
  contains its `forward`/`sample`/`readback`/`audio` ranges);
- `launches`: kernel and graph launches the host made, per name;
- `top_ops`: the host ops called most often (count and inclusive ms), where eager work hides;
- `phase_gpu`: per nest of phases (`talker.mixed_step>talker.prefill_embed`), its host ms
  (nested phases included) and the kernels its own launches started, not its nested
  phases' (count and summed GPU ms, a graph replay's kernels included): a phase's device
  work, read without synchronising anything.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

RANGE_PREFIX = "omniflow."
"""Profiler ranges of engine phases are named `omniflow.<stage>.<phase>`."""

TOP_OPS = 25
"""How many host ops (by call count: a launch-bound step is many small ones) to list."""

LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
)
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
"""Trace categories of launches: the runtime's, and the driver's (Triton launches there)."""
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Trace categories of device work: what counts as the GPU being busy."""


class RangeTimer:
    """A `PhaseTimer` that marks every phase as a profiler range and synchronises nothing."""

    def phase(self, stage: str, name: str) -> AbstractContextManager[object]:
        return torch.profiler.record_function(f"{RANGE_PREFIX}{stage}.{name}")


def timeline_profiler(device: str) -> torch.profiler.profile:
    """A profiler of every thread's host ops and ranges (the engine runs in its own thread,
    started before the profiler) and, on CUDA, every kernel."""
    # Kineto's experimental config (a private torch API, for a bench tool only) is how torch
    # profiles threads other than the one that starts the profiler.
    from torch._C._profiler import _ExperimentalConfig

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    config = _ExperimentalConfig(profile_all_threads=True)
    return torch.profiler.profile(activities=acts, experimental_config=config)


def load_trace(path: Path) -> list[dict[str, Any]]:
    """The trace's events (a chrome trace, gzip-compressed when the name ends in .gz)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)["traceEvents"]


def union_ms(spans: list[tuple[float, float]]) -> float:
    """Milliseconds covered by at least one of the (start us, end us) spans."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total / 1e3


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Wall, GPU-busy and per-phase host time of a trace (see the module docstring)."""
    work = [
        (e.get("cat"), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS
    ]
    kernels = [(s, e) for cat, s, e in work if cat == "kernel"]
    spans = [(s, e) for _, s, e in work]
    host: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    launches: dict[str, int] = defaultdict(int)
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") != "X":
            continue
        name = e.get("name", "")
        if e.get("cat") == "user_annotation" and name.startswith(RANGE_PREFIX):
            host[name[len(RANGE_PREFIX) :]] += float(e["dur"]) / 1e3
            count[name[len(RANGE_PREFIX) :]] += 1
        elif e.get("cat") in LAUNCH_CATS and name in LAUNCH_NAMES:
            launches[name] += 1
        elif e.get("cat") == "cpu_op":
            ops[name][0] += 1
            ops[name][1] += float(e["dur"]) / 1e3
    # No kernels (a CPU run): the host ranges alone, wall and busy 0.
    wall = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e3 if spans else 0.0
    busy = union_ms(spans)
    return {
        "wall_ms": wall,
        "gpu_busy_ms": busy,
        "gpu_busy_share": busy / wall if wall else 0.0,
        "kernels": len(kernels),
        "launches": dict(launches),
        "host_ms": {k: {"count": count[k], "ms": round(v, 3)} for k, v in sorted(host.items())},
        "phase_gpu": phase_gpu(events),
        "top_ops": [
            {"name": n, "count": c, "ms": round(t, 3)}
            for n, (c, t) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
        ],
    }


def phase_gpu(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per nest of engine phases on one thread: count, host ms (nested phases included), and
    the kernels launched inside it (their correlation ids match the launch's), attributed to
    the innermost phase only. A launch or kernel without a correlation id is nobody's."""
    kernel_ms: dict[int, list[float]] = defaultdict(list)
    marks: dict[Any, list[tuple[float, int, float, str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name", "")
        start, dur = float(e["ts"]), float(e["dur"])
        correlation = int(e.get("args", {}).get("correlation", -1))
        thread = (e.get("pid"), e.get("tid"))
        if cat == "kernel" and correlation >= 0:
            kernel_ms[correlation].append(dur / 1e3)
        elif cat == "user_annotation" and name.startswith(RANGE_PREFIX):
            phase = name[len(RANGE_PREFIX) :]
            # at one instant: ranges close, then open (the longer first), then launches
            marks[thread].append((start, 1, -dur, phase, dur))
            marks[thread].append((start + dur, 0, 0.0, phase, None))
        elif cat in LAUNCH_CATS and name in LAUNCH_NAMES and correlation >= 0:
            marks[thread].append((start, 2, 0.0, "", correlation))
    out: dict[str, dict[str, float]] = defaultdict(
        lambda: {"count": 0, "host_ms": 0.0, "kernels": 0, "gpu_ms": 0.0}
    )
    for seq in marks.values():
        stack: list[str] = []
        for _, kind, _, phase, value in sorted(seq, key=lambda m: m[:3]):
            if kind == 1:
                stack.append(phase)
                row = out[">".join(stack)]
                row["count"] += 1
                row["host_ms"] += value / 1e3
            elif kind == 0:
                if phase in stack:
                    del stack[len(stack) - 1 - stack[::-1].index(phase)]
            elif stack:
                row = out[">".join(stack)]
                ms = kernel_ms.get(value, [])
                row["kernels"] += len(ms)
                row["gpu_ms"] += sum(ms)
    return {
        k: {**v, "host_ms": round(v["host_ms"], 3), "gpu_ms": round(v["gpu_ms"], 3)}
        for k, v in sorted(out.items())
    }
