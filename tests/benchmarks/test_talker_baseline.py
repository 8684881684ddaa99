"""`benchmarks.talker_baseline`: the batch it reports is the batch that ran, and `--requests`
keeps that many in flight (the steady state, where most steps are mixed)."""

from __future__ import annotations

import pytest

from benchmarks.talker_baseline import BatchTooLarge, run_batch


def test_a_batch_above_max_num_seqs_is_refused_naming_the_key():
    """The scheduler would clamp it silently to max_num_seqs rows per step (the 1.7B 'batch
    128' figures of an earlier session were 32-row steps)."""
    with pytest.raises(BatchTooLarge, match=r"pipeline\.stages\.talker\.scheduler\.max_num_seqs=2"):
        run_batch(
            "qwen3_tts_tiny",
            "cpu",
            "qwen3_tts_fused",
            3,
            2,
            overrides=("pipeline.stages.talker.scheduler.max_num_seqs=2",),
        )


def test_requests_keep_the_batch_in_flight_until_all_have_ended():
    """Six requests, two in flight: every one ends without error, and the batch is refilled
    as requests end (equal lengths: each pair ends together, so each refill is a prefill
    step of its own; `tests/stages/test_prefill_counters.py` has one beside decode rows)."""
    r = run_batch("qwen3_tts_tiny", "cpu", "qwen3_tts_fused", 2, 3, requests=6)
    assert r["requests"] == 6 and r["errors"] == []
    assert r["window_k"] == {"talker": 0}  # the resolved window, recorded (null on the CPU)
    phases = r["phases_ms"]
    assert phases["talker.mixed_step"]["n"] >= 3
    assert phases["talker.prefill"]["n"] == phases["talker.mixed_step"]["n"]
    # the stage's prefill counters: one per timed prefill, all eager on the CPU
    p = r["prefills"]
    assert p["steps"] == phases["talker.prefill"]["n"] and p["eager"] == p["steps"]
    # 6 requests x 3 frames, at most 2 rows a step: at least 9 steps in all
    assert phases["talker.mixed_step"]["n"] + phases["talker.decode_step"]["n"] >= 9


def test_requests_below_the_smallest_batch_or_negative_are_refused(monkeypatch, capsys):
    """A value that would quietly become the batch is a usage error, not a smaller run."""
    from benchmarks import talker_baseline

    for bad in ("-1", "3"):
        argv = ["talker_baseline", "--model", "qwen3_tts_tiny", "--platform", "cpu"]
        argv += ["--batch", "4", "--frames", "1", "--requests", bad]  # quick if it did run
        monkeypatch.setattr("sys.argv", argv)
        with pytest.raises(SystemExit) as exit_info:
            talker_baseline.main()
        assert exit_info.value.code == 2
        assert f"--requests {bad}" in capsys.readouterr().err


def test_the_p90_lies_between_the_median_and_the_maximum():
    """With two steps the rounded-down index gave the minimum as the p90 (a 128-row mixed
    step's p90 below its median in a committed result)."""
    from benchmarks.talker_baseline import summary

    two = summary([100.0, 200.0])
    assert two["median"] <= two["p90"] <= 200.0 and two["p90"] == 190.0
    assert summary([5.0])["p90"] == 5.0
    many = summary([float(i) for i in range(1, 101)])
    assert 89.0 < many["p90"] < 92.0


def test_a_profile_writes_the_kernel_categories_per_engine_step(tmp_path):
    """`--profile`: the table is divided by the engine's steps (one prefill step, then a
    decode step per further frame), before the raw kernel tables."""
    prefix = str(tmp_path / "prof")
    run_batch("qwen3_tts_tiny", "cpu", "qwen3_tts_fused", 2, 4, profile=prefix)
    text = (tmp_path / "prof.b2.txt").read_text()
    assert text.startswith("kernels by category, per step (4 steps,")
    assert "| category | launches per step |" in text


def test_frames_0_gives_each_request_its_prompts_natural_length(monkeypatch):
    """`--frames 0 --requests N`: each request asks its prompt's length (the shipped
    prompts' seconds x 12.5), so requests end apart and arrivals spread out."""
    from benchmarks import talker_baseline
    from omniflow.bench.client import DEFAULT_PROMPTS, load_prompts

    asked: list[int] = []
    real = talker_baseline.SpeechRequest.create

    def create(text, **kw):
        asked.append(kw["max_new_tokens"])
        return real(text, **{**kw, "max_new_tokens": 2})  # quick: the ask is what is checked

    monkeypatch.setattr(talker_baseline.SpeechRequest, "create", create)
    r = run_batch("qwen3_tts_tiny", "cpu", "qwen3_tts_fused", 2, 0, requests=4)
    assert r["errors"] == [] and r["frames_per_request"] == "natural"
    assert asked == [p.frames for p in load_prompts(DEFAULT_PROMPTS, 4)]
    assert len(set(asked)) > 1


def test_frames_0_without_requests_is_refused(monkeypatch, capsys):
    from benchmarks import talker_baseline

    argv = ["talker_baseline", "--model", "qwen3_tts_tiny", "--platform", "cpu", "--frames", "0"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        talker_baseline.main()
    assert exit_info.value.code == 2 and "--frames 0" in capsys.readouterr().err


def test_a_timeline_span_records_only_its_requests(tmp_path):
    """One request at a time, recording from the 2nd ended request for 2 more: exactly the
    3rd and 4th requests' prefills are in the trace (the recording starts before the next
    request is sent, and stops before the one after the span); the whole run's has all 6."""
    import gzip
    import json

    def prefills_traced(span: tuple[int, int]) -> int:
        prefix = str(tmp_path / f"t{span[0]}")
        r = run_batch(
            "qwen3_tts_tiny",
            "cpu",
            "qwen3_tts_fused",
            1,
            2,
            requests=6,
            timeline=prefix,
            timeline_span=span,
        )
        assert r["errors"] == []
        events = json.loads(gzip.decompress((tmp_path / f"t{span[0]}.b1.json.gz").read_bytes()))
        return sum(e.get("name") == "omniflow.talker.prefill" for e in events["traceEvents"])

    whole = prefills_traced((0, 0))
    part = prefills_traced((2, 2))
    assert whole == 6
    assert part == 2
