"""`omniflow.bench.serve_overhead`: the synthetic pipeline served to the real load generator
(child process) on loopback. It must deliver every request's exact audio (the client counts a
wrong length as a failure) and time the same steps with and without HTTP."""

from __future__ import annotations

import argparse
import threading

from omniflow.bench.serve_overhead import (
    SyntheticPipeline,
    iterations_per_second,
    offline,
    python_work,
    run_case,
    step_summary,
)


def test_a_small_case_serves_every_frame_and_reports_both_step_times():
    args = argparse.Namespace(
        concurrency=2, num_prompts=3, frames=5, device_ms=2.0, host_ms=0.5, syncs=2
    )
    r = run_case(args, window=2)
    assert r["failed"] == 0 and r["errors"] == []
    assert r["no_http"]["steps"] == 6  # 5 frames in windows of 2: 3 windows of 2 steps
    assert r["http"]["steps"] >= 6
    assert 2.0 <= r["no_http"]["step_ms_median"] < 50.0  # 2 ms asleep + 0.5 ms spinning
    assert r["events_per_s"] > 0 and r["audio_throughput"] > 0
    assert 0 < r["mean_rows_per_step"] <= 2


def test_host_work_is_a_fixed_amount_that_contention_lengthens():
    """A step's host part is work, not a deadline: another thread holding the interpreter
    lock (the server's event loop, in the real case) makes the step take longer, so the bench
    can show a stretch. A deadline-based spin took the same wall time either way."""
    assert SyntheticPipeline(0.0, 0.010, 1, syncs=2, rate=1e6).part_iterations == 5_000
    rate = iterations_per_second()

    def median_step_ms() -> float:
        pipe = SyntheticPipeline(0.0, 0.040, 1, syncs=1, rate=rate)  # 40 ms of work a step
        pipe.start()
        try:
            offline(pipe, concurrency=1, frames=4)
        finally:
            pipe.stop()
        return step_summary(pipe.clock.seconds)["step_ms_median"]

    alone = median_step_ms()
    stop = threading.Event()

    def compete() -> None:
        while not stop.is_set():
            python_work(1_000)

    other = threading.Thread(target=compete)
    other.start()
    try:
        shared = median_step_ms()
    finally:
        stop.set()
        other.join()
    assert shared > 1.3 * alone, (alone, shared)
