"""`deploy.router=least_loaded`'s choice (omniflow/deploy/load.py), without a cluster: the
replica with the most free seats, then the fewest in flight, by its report brought up to
date with what this router sent and saw end since; every request of a burst counted as it
is routed; stale or missing reports fall back to this router's own counts. The key
`deploy.router` itself: tests/deploy/test_deploy_config.py."""

from __future__ import annotations

import random

from omniflow.deploy.load import RESERVE_S, STALE_S, Gauges, Ledger, gauges_of, rank

NOW = 1000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def ranked(ledger: Ledger, reports: dict[str, Gauges | None], now: float = NOW) -> list[str]:
    return rank(ledger, list(reports.items()), now, random.Random(0))


def test_the_replica_with_more_free_seats_then_fewer_in_flight_goes_first():
    ledger = Ledger(Clock())
    reports = {"a": Gauges(3, 29, NOW - 0.5), "b": Gauges(1, 31, NOW - 0.5)}
    assert ranked(ledger, reports) == ["b", "a"]
    # seats first: b holds fewer requests but has no seat free (its talker is full)
    reports = {"a": Gauges(4, 2, NOW - 0.5), "b": Gauges(3, 0, NOW - 0.5)}
    assert ranked(ledger, reports) == ["a", "b"]
    reports = {"a": Gauges(2, 5, NOW - 0.5), "b": Gauges(1, 5, NOW - 0.5)}
    assert ranked(ledger, reports) == ["b", "a"]


def test_a_burst_is_spread_before_any_report_counts_it():
    """Six requests routed at once against reports that still say both are idle."""
    clock = Clock()
    ledger = Ledger(clock)
    reports = {"a": Gauges(0, 32, NOW - 0.5), "b": Gauges(0, 32, NOW - 0.5)}
    chosen = []
    for i in range(6):
        first = ranked(ledger, reports)[0]
        ledger.reserve(f"r{i}", first)  # what the router does as it chooses
        chosen.append(first)
    assert sorted(chosen.count(r) for r in "ab") == [3, 3]
    for i, replica in enumerate(chosen):  # accepted: counted as open, no longer reserved
        ledger.routed(f"r{i}", replica)
    assert ledger.load("a", reports["a"], NOW) == (29, 3)


def test_requests_ended_since_a_report_no_longer_count():
    clock = Clock()
    ledger = Ledger(clock)
    clock.now = NOW - 2
    for i, replica in enumerate("aab"):
        ledger.routed(f"r{i}", replica)
    report = {"a": Gauges(2, 30, NOW - 1), "b": Gauges(1, 31, NOW - 1)}  # both counted there
    clock.now = NOW - 0.5
    ledger.completed("r0")
    ledger.completed("r1")  # a is idle now, though its report says 2
    assert ledger.load("a", report["a"], NOW) == (32, 0)
    assert ranked(ledger, report) == ["a", "b"]


def test_a_request_ended_before_its_acceptance_was_heard_still_corrects_the_report():
    clock = Clock()
    ledger = Ledger(clock)
    clock.now = NOW - 2
    ledger.reserve("r0", "a")
    report = Gauges(1, 31, NOW - 1)  # a counts r0
    clock.now = NOW - 0.5
    ledger.completed("r0")  # no routed() first
    assert ledger.load("a", report, NOW) == (32, 0)


def test_stale_or_missing_reports_fall_back_to_this_routers_own_counts():
    clock = Clock()
    ledger = Ledger(clock)
    ledger.routed("r0", "a")
    stale = {"a": Gauges(0, 32, NOW - STALE_S - 1), "b": Gauges(5, 27, NOW - 0.5)}
    assert ledger.load("a", stale["a"], NOW) is None
    assert ranked(ledger, stale) == ["b", "a"]  # by the reports, b would be last
    assert ranked(ledger, {"a": Gauges(0, 32, NOW), "b": None}) == ["b", "a"]
    ledger.routed("r1", "b")
    ledger.routed("r2", "b")
    assert ranked(ledger, stale) == ["a", "b"]


def test_reservations_expire_and_dead_replicas_are_forgotten():
    clock = Clock()
    ledger = Ledger(clock)
    ledger.reserve("cancelled", "a")  # never accepted: its client went away
    assert ledger.outstanding("a", NOW) == 1
    assert ledger.outstanding("a", NOW + RESERVE_S + 0.1) == 0
    ledger.routed("r1", "b")
    ledger.forget("b")
    assert ledger.outstanding("b", NOW) == 0
    ledger.completed("early")  # its end heard before its acceptance: never counted open
    ledger.routed("early", "a")
    assert ledger.outstanding("a", NOW) == 1  # the reservation alone


def test_ties_are_broken_at_random():
    firsts = {rank(Ledger(Clock()), [("a", None), ("b", None)], NOW)[0] for _ in range(40)}
    assert firsts == {"a", "b"}


def test_gauges_come_from_the_source_stages_seats():
    from omniflow.core.pipeline import PipelineStats, StageStats

    talker = StageStats(name="talker", alive=True, running=3, waiting=2)
    code2wav = StageStats(name="code2wav", alive=True, running=7, waiting=0)
    stats = PipelineStats(in_flight=9, stages=(talker, code2wav))
    gauges = gauges_of(stats, "talker", 4, NOW)
    assert gauges == Gauges(9, -1, NOW)
    assert Gauges.of(gauges.as_stats()) == gauges
    assert Gauges.of({}) is None
