"""The timeline summary: GPU-busy time as a union of kernel spans, host time per phase from
the engine's profiler ranges, and the ranges themselves recorded without any sync."""

from __future__ import annotations

import gzip
import json

import torch

from benchmarks.graph_trace import replay_stats, split_replays
from benchmarks.timeline import RangeTimer, load_trace, phase_gpu, summarize, union_ms


def kernel(ts: float, dur: float, name: str = "k") -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def span(cat: str, name: str, dur: float, ts: float = 0) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_busy_time_counts_overlapping_kernels_once():
    spans = [(0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (21.0, 22.0)]
    assert union_ms(spans) == (12.0 + 5.0) / 1e3


def test_summary_of_a_trace(tmp_path):
    events = [
        kernel(100, 50),
        kernel(120, 60),  # overlaps the first: busy 100..180
        kernel(400, 100),  # idle 180..400
        span("gpu_memcpy", "Memcpy DtoH", 20, ts=490),  # overlaps the last kernel by 10
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "omniflow.talker.sample",
            "ts": 0,
            "dur": 2000,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "omniflow.talker.sample",
            "ts": 0,
            "dur": 1000,
        },
        {"ph": "X", "cat": "user_annotation", "name": "other.range", "ts": 0, "dur": 9000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 0, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 9, "dur": 5},
    ]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    s = summarize(load_trace(path))
    assert s["wall_ms"] == 0.41 and s["gpu_busy_ms"] == 0.19
    assert s["kernels"] == 3 and s["launches"] == {"cudaGraphLaunch": 1}
    assert s["host_ms"] == {"talker.sample": {"count": 2, "ms": 3.0}}
    assert s["top_ops"] == [{"name": "aten::add", "count": 2, "ms": 0.008}]


def test_range_timer_marks_phases_in_a_cpu_trace(tmp_path):
    """The engine's phases appear as ranges named omniflow.<stage>.<phase>; on the CPU there
    are no kernels, so wall and busy are 0."""
    timer = RangeTimer()
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, timer.phase("talker", "forward"):
        torch.ones(4).add_(1)
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    s = summarize(load_trace(path))
    assert s["host_ms"]["talker.forward"]["count"] == 1
    assert s["wall_ms"] == 0.0 and s["gpu_busy_ms"] == 0.0


def test_graph_trace_splits_replays_and_measures_gaps():
    spans = [("a", 0.0, 2.0), ("b", 3.0, 1.0), ("a", 10.0, 2.0), ("b", 12.0, 1.0)]
    first, second = split_replays(spans, 2)
    stats = replay_stats(first)
    assert stats["kernels"] == 2 and stats["wall_us"] == 4.0
    assert stats["kernel_us"] == 3.0 and stats["gap_us"] == 1.0
    assert replay_stats(second)["gap_us"] == 0.0
    assert {r["name"]: r["count"] for r in stats["by_name"]} == {"a": 1, "b": 1}
    try:
        split_replays(spans[:3], 2)
    except RuntimeError as exc:
        assert "do not split" in str(exc)
    else:
        raise AssertionError("an uneven trace must be refused")


def rng(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    """An engine phase's profiler range on thread `tid`."""
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"omniflow.talker.{name}",
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": tid,
    }


def launch(
    ts: float,
    corr: int | None,
    tid: int = 1,
    cat: str = "cuda_runtime",
    name: str = "cudaLaunchKernel",
) -> dict:
    """A launch on thread `tid` with correlation id `corr` (None: the trace gave none)."""
    args = {} if corr is None else {"correlation": corr}
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": 1,
        "pid": 1,
        "tid": tid,
        "args": args,
    }


def k(corr: int | None, dur: float = 100, ts: float = 0) -> dict:
    """A kernel of the launch with correlation id `corr`."""
    args = {} if corr is None else {"correlation": corr}
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": args}


def test_phase_gpu_gives_each_launch_kernels_to_its_innermost_phase():
    """Kernels belong to the phase whose thread launched them (by correlation id), not to
    whatever ran on the host when the GPU ran them; a graph replay brings all its kernels."""

    events = [
        rng("mixed_step", 0, 1000),
        rng("prefill_embed", 100, 200),
        launch(150, 1),
        rng("prefill", 300, 100),
        launch(310, 2, name="cudaGraphLaunch"),
        launch(600, 3),  # in mixed_step, outside its inner phases
        rng("forward", 2000, 50, tid=2),
        launch(2010, 4, tid=2),
        launch(5000, 5),  # outside every phase: nobody's
        k(1, 2000, ts=900),  # runs long after the embed's host range: still the embed's
        k(2, 500, ts=3000),
        k(2, 500, ts=3500),
        k(3, 100, ts=4000),
        k(4, 300, ts=4100),
        k(5, 700, ts=4400),
    ]
    got = phase_gpu(events)
    assert got["talker.mixed_step>talker.prefill_embed"] == {
        "count": 1,
        "host_ms": 0.2,
        "kernels": 1,
        "gpu_ms": 2.0,
    }
    assert got["talker.mixed_step>talker.prefill"]["kernels"] == 2
    assert got["talker.mixed_step>talker.prefill"]["gpu_ms"] == 1.0
    assert got["talker.mixed_step"] == {"count": 1, "host_ms": 1.0, "kernels": 1, "gpu_ms": 0.1}
    assert got["talker.forward"] == {"count": 1, "host_ms": 0.05, "kernels": 1, "gpu_ms": 0.3}
    assert sum(v["kernels"] for v in got.values()) == 5


def test_phase_gpu_at_shared_instants_and_without_correlation_ids():
    """A phase that opens as its sibling closes is not nested in it; of two opening together
    the longer holds the shorter; a driver launch (Triton's) counts; launches and kernels
    without a correlation id are nobody's (they would otherwise all match each other)."""

    events = [
        rng("sample", 100, 10),  # given before the longer range opening with it
        rng("decode_step", 100, 200),
        rng("forward", 110, 50),  # opens as `sample` closes: a sibling, not its child
        launch(110, 1),
        launch(120, 2, cat="cuda_driver", name="cuLaunchKernelEx"),
        launch(130, None),
        launch(140, None),
        k(1),
        k(2),
        k(None),
        k(None),
    ]
    got = phase_gpu(events)
    assert set(got) == {
        "talker.decode_step",
        "talker.decode_step>talker.sample",
        "talker.decode_step>talker.forward",
    }
    assert got["talker.decode_step>talker.forward"]["kernels"] == 2
    assert got["talker.decode_step>talker.forward"]["gpu_ms"] == 0.2
    assert sum(v["kernels"] for v in got.values()) == 2
