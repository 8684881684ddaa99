"""`benchmarks.open_loop_trace`: each request's wait split at its seat, and the phases that
overlapped it, from a real in-process run and a hand-made timeline."""

from __future__ import annotations

import argparse
import time

import pytest

from benchmarks.open_loop_trace import RecordingTimer, run
from benchmarks.trace_parts import (
    Arrival,
    Phase,
    describe,
    overlap,
    phase_kinds,
    stalled,
    window_delta,
)
from omniflow.bench.prompt_file import DEFAULT_PROMPTS
from omniflow.core.pipeline import WindowCounters


def test_overlap_counts_only_the_part_inside_the_wait():
    phases = [
        Phase("talker", "decode_step", 0.0, 0.010),  # 5 ms inside [0.005, 0.030]
        Phase("talker", "mixed_step", 0.010, 0.025),  # wholly inside
        Phase("talker", "audio_wait", 0.028, 0.040),  # 2 ms inside
        Phase("talker", "decode_step", 0.031, 0.050),  # after: nothing
    ]
    got = overlap(phases, 0.005, 0.030)
    want = {"talker.decode_step": 0.005, "talker.mixed_step": 0.015, "talker.audio_wait": 0.002}
    assert got == pytest.approx(want)


def test_two_stages_phases_of_one_name_stay_apart():
    phases = [
        Phase("talker", "audio_wait", 0.0, 0.010),
        Phase("code2wav", "audio_wait", 0.0, 0.010),
    ]
    got = overlap(phases, 0.0, 0.010)
    assert got == pytest.approx({"talker.audio_wait": 0.010, "code2wav.audio_wait": 0.010})


def test_describe_splits_each_wait_at_its_seat():
    a = Arrival(0, submitted=1.0, seated=1.004, first=1.020)
    b = Arrival(1, submitted=2.0, seated=2.010, first=2.040)
    phases = [
        Phase("talker", "mixed_step", 1.004, 1.016),
        Phase("talker", "mixed_step", 2.0, 2.030),
    ]
    got = describe([a, b], phases)
    assert got["requests"] == 2
    assert got["first_audio_ms"] == pytest.approx(30.0)  # (20 + 40) / 2
    assert got["queued_ms"] == pytest.approx(7.0)  # (4 + 10) / 2
    assert got["steps_ms"] == pytest.approx(23.0)  # (16 + 30) / 2
    assert got["talker.mixed_step_ms"] == pytest.approx(21.0)  # (12 + 30) / 2


def test_phase_kinds_count_each_phase_and_its_share_of_the_wall():
    phases = [
        Phase("talker", "decode_step", 0.0, 0.010),
        Phase("talker", "forward", 0.0, 0.004),  # inside a step, counted on its own
        Phase("talker", "decode_step", 0.010, 0.030),
        Phase("talker", "mixed_step", 0.030, 0.070),
    ]
    got = phase_kinds(phases, wall_s=0.1)
    assert set(got) == {"talker.decode_step", "talker.mixed_step", "talker.forward"}
    assert got["talker.forward"]["count"] == 1
    decode = got["talker.decode_step"]
    assert decode["count"] == 2 and decode["share"] == pytest.approx(0.3)
    assert decode["max_ms"] == pytest.approx(20.0) and decode["p50_ms"] == pytest.approx(20.0)
    assert got["talker.mixed_step"]["share"] == pytest.approx(0.4)


def test_stalls_are_found_from_the_audio_as_made_and_the_steps_in_the_gap_named():
    rate = 100  # samples a second: 10 samples are 0.1 s of audio
    on_time = Arrival(0, first=1.0, chunks=[(1.0, 10), (1.05, 10), (1.15, 10)])
    late = Arrival(1, first=1.0, chunks=[(1.0, 10), (1.13, 10), (1.20, 20)])  # dry 1.1-1.13
    phases = [Phase("talker", "mixed_step", 1.09, 1.12), Phase("talker", "forward", 2.0, 2.1)]
    (stall,) = stalled([on_time, late], phases, rate, t0=0.5, longest=5)
    assert stall["index"] == 1
    assert stall["at_s"] == pytest.approx(0.6) and stall["length_ms"] == pytest.approx(30.0)
    assert stall["phases_ms"] == pytest.approx({"talker.mixed_step": 20.0})


def test_a_window_delta_is_what_one_run_added():
    before = WindowCounters(3, 2, 10, {"waiting": 4}, {8: 2, 4: 1}, 1, 0)
    after = WindowCounters(5, 4, 20, {"waiting": 6, "slack": 1}, {8: 3, 4: 1, 2: 1}, 1, 2)
    got = window_delta(before, after)
    assert got == {
        "planned": 2,
        "executed": 2,
        "steps": 10,
        "sizes": {2: 1, 8: 1},
        "refusals": {"slack": 1, "waiting": 2},
        "cut": 0,
        "arrival_steps": 2,
    }


def test_the_recording_timer_keeps_each_phase_on_one_clock():
    timer = RecordingTimer()
    with timer.phase("talker", "forward"):
        pass
    (p,) = timer.phases
    assert (p.stage, p.name) == ("talker", "forward") and p.start <= p.end


def test_a_synchronising_timer_waits_for_the_device_inside_the_phase():
    calls: list[float] = []
    timer = RecordingTimer(sync=lambda: calls.append(time.perf_counter()))
    with timer.phase("talker", "forward"):
        pass
    (p,) = timer.phases
    assert len(calls) == 2  # before and after
    assert calls[0] <= p.start and p.end >= calls[1]


def test_a_run_on_the_tiny_model_hears_every_request_and_times_its_steps():
    args = argparse.Namespace(
        model="qwen3_tts_tiny",
        platform="cpu",
        pipeline="qwen3_tts_fused",
        # windows, as on a GPU (no playback clock: the slow CPU's slack would refuse them)
        override=[
            "pipeline.stages.talker.window_k=4",
            "pipeline.stages.talker.playback_margin_ms=null",
        ],
        rps=[40.0, 20.0],
        seconds=0.2,
        seed=1,
        prompts=str(DEFAULT_PROMPTS),
        voice="vivian",
        max_frames=12,
        slowest=0.5,
        stalls=3,
        sync_phases=True,
    )
    fast, slow = run(args)["rates"]  # both rates on one pipeline
    assert (fast["rps"], slow["rps"]) == (40.0, 20.0)
    assert slow["start"] > max(a["first"] for a in fast["arrivals"])
    assert all(p["start"] >= slow["start"] for p in slow["phases"])
    result = fast
    assert result["requests"] >= 2 and result["failed"] == []
    assert result["heard"] == result["requests"]
    for a in result["arrivals"]:
        assert a["submitted"] <= a["seated"] <= a["first"]
    names = {p["name"] for p in result["phases"]}
    assert "mixed_step" in names  # every arrival's prefill ran in a timed execute
    assert result["slowest"]["first_audio_ms"] >= result["faster_half"]["first_audio_ms"]
    assert result["steps"]["talker.mixed_step"]["count"] >= 1
    assert (
        result["steps"]["talker.plan_state"]["count"]
        >= result["steps"]["talker.mixed_step"]["count"]
    )
    # the count and the described stalls come from the same player
    assert (result["stalled_requests"] > 0) == bool(result["stalls"])
    assert len(result["stalls"]) <= 3
    talker = result["windows"]["talker"]
    assert talker["executed"] >= 1 and talker["steps"] >= 2 * talker["executed"]
    assert sum(talker["sizes"].values()) == talker["planned"]
