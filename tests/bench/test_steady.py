"""A closed-loop round's steady state (`omniflow.bench.steady`): the span from the first
lane's second send to the last send, its audio pro-rated over each request's delivery."""

from __future__ import annotations

import json

import pytest

from omniflow.bench.outcome import Failure, Outcome, Sample, summarize
from omniflow.bench.steady import steady_state


def sample(sent: float | None, ttfp: float, e2el: float, audio: float) -> Sample:
    return Sample(ttfp=ttfp, e2el=e2el, audio_s=audio, underrun_s=0.0, sent_s=sent)


# two lanes: A and B open the round together; C follows A on its lane, D follows B and C
ROUND = [
    sample(0.0, 0.1, 1.1, 2.0),  # A: delivers over 0.1-1.1, before the span
    sample(0.0, 0.1, 2.1, 4.0),  # B: 0.1-2.1, half of it inside 1.1-2.1
    sample(1.1, 0.1, 1.0, 2.0),  # C: 1.2-2.1, all inside
    sample(2.1, 0.1, 1.0, 2.0),  # D: 2.2-3.1, after
]


def test_a_hand_worked_round():
    got = steady_state(ROUND, [], lanes=2)
    assert got is not None
    assert got["start_s"] == pytest.approx(1.1) and got["span_s"] == pytest.approx(1.0)
    assert got["audio_throughput"] == pytest.approx(4.0)  # B's 2.0 + C's 2.0 in 1.0 s
    assert got["requests"] == 2 and got["ttfp_mean_s"] == pytest.approx(0.1)  # C and D


def test_a_failed_request_still_ends_the_span_at_its_send():
    got = steady_state(ROUND, [Failure(prompt=4, error="x", after_s=0.1, sent_s=3.1)], lanes=2)
    assert got is not None and got["span_s"] == pytest.approx(2.0)
    assert got["audio_throughput"] == pytest.approx((2.0 + 2.0 + 2.0 * 0.9 / 0.9) / 2.0)


def test_failures_sent_in_the_span_are_counted_and_no_first_audio_is_made_up():
    """Both requests sent in the span failed: no first audio to average (None, not 0), and
    the span says two of its requests failed."""
    failed = [Failure(2, "HTTP 503: busy", 0.01, sent_s=1.1), Failure(3, "x", 0.01, sent_s=2.1)]
    got = steady_state(ROUND[:2], failed, lanes=2)
    assert got is not None
    assert got["requests"] == 0 and got["ttfp_mean_s"] is None and got["failed"] == 2
    assert steady_state(ROUND, [], lanes=2)["failed"] == 0


def test_the_log_line_says_a_span_with_failures_is_not_clean_and_none_when_all_failed():
    """The round's log line (`bench.job.steady_text`): a figure, one marked unclean, or none
    at all, never "0.00 audio-s/s" beside requests that were only refused."""
    from omniflow.bench.job import steady_text

    clean = steady_text(steady_state(ROUND, [], lanes=2))
    assert clean == "4.00 audio-s/s over 1.0 s, first audio 100 ms mean"
    one = [Failure(4, "HTTP 503: busy", 0.01, sent_s=1.5)]
    unclean = steady_text(steady_state(ROUND, one, lanes=2))
    assert unclean.endswith("(not clean: 1 of the requests sent in it failed)")
    failed = [Failure(2, "HTTP 503: busy", 0.01, sent_s=1.1), Failure(3, "x", 0.01, sent_s=2.1)]
    assert steady_text(steady_state(ROUND[:2], failed, lanes=2)) == (
        "none (the 2 requests sent in it failed)"
    )


@pytest.mark.parametrize(
    ("samples", "lanes"),
    [
        (ROUND[:2], 2),  # no more requests than lanes: no turnover
        (ROUND, 0),  # lanes unknown (a file from before they were kept)
        ([*ROUND[:3], sample(None, 0.1, 1.0, 2.0)], 2),  # a send time unknown
    ],
)
def test_no_span_is_none(samples, lanes):
    assert steady_state(samples, [], lanes) is None


def test_the_summary_carries_it():
    assert summarize(Outcome(ROUND, [], wall_s=3.1, lanes=2))["steady"]["requests"] == 2
    assert summarize(Outcome(ROUND, [], wall_s=3.1))["steady"] is None


def test_a_job_reports_the_steady_state_of_its_rounds(tmp_path, monkeypatch):
    from omniflow.bench import job
    from omniflow.bench.sweep import summarize as summarize_sweep
    from omniflow.config.compose import compose

    twice = [ROUND] + [[sample(s.sent_s, s.ttfp, s.e2el, 2 * s.audio_s) for s in ROUND]]
    outcomes = iter(Outcome(r, [], wall_s=3.1, lanes=2) for r in twice)
    monkeypatch.setattr(job, "load_in_child", lambda args, bar=None: next(outcomes))
    spec = compose(["platform=cpu", "bench.num_prompts=4", "bench.rounds=2", "bench.warmup=0"])
    job.run_job(spec, ["bench.rounds=2"], tmp_path / "0")
    summary = json.loads((tmp_path / "0" / "result.json").read_text())["summary"]
    assert summary["steady_audio_throughput"] == {"median": 6.0, "min": 4.0, "max": 8.0}
    assert summary["steady_ttfp_mean_s"]["median"] == pytest.approx(0.1)
    table = summarize_sweep(tmp_path)
    assert "| steady audio-s/s |" in table and "| 6.00 |" in table
