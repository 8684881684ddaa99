"""How loaded each replica is, for `deploy.router=least_loaded` (deploy/router.py): the
replica's own gauges (in-flight streams, free seats of its source stage), reported every
`REPORT_S` through Ray Serve's routing stats, corrected by what this router has sent and
seen end since each report. The correction is what spreads a burst: requests that arrive
together are all routed before any report can count them. No Ray here: unit-tested alone."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omniflow.core.pipeline import PipelineStats

REPORT_S = 1.0
"""How often Ray Serve asks each replica for its gauges (request_routing_stats_period_s)."""
STALE_S = 3.0
"""A report older than this is not trusted (the replica is busy past answering, dying, or
being replaced): ranking falls back to this router's own counts for every candidate."""
RESERVE_S = 2.0
"""A replica chosen for a request counts it until the replica accepts it or this passes (a
request cancelled while being routed is never confirmed)."""


@dataclass(frozen=True)
class Gauges:
    """One replica's report: requests admitted and not ended, free seats of its source stage
    (negative: requests queued past them), and the wall-clock time it was taken."""

    in_flight: int
    free_seats: int
    at: float

    def as_stats(self) -> dict[str, float]:
        return {"in_flight": self.in_flight, "free_seats": self.free_seats, "at": self.at}

    @classmethod
    def of(cls, stats: dict) -> Gauges | None:
        """The gauges in a replica's routing stats; None before its first report."""
        if not {"in_flight", "free_seats", "at"} <= stats.keys():
            return None
        return cls(int(stats["in_flight"]), int(stats["free_seats"]), float(stats["at"]))


def gauges_of(stats: PipelineStats, source: str, seats: int, now: float) -> Gauges:
    """A replica's gauges from its pipeline's stats; `source` names the stage a new request
    is seated in first, `seats` how many requests it holds at once."""
    stage = next(s for s in stats.stages if s.name == source)
    return Gauges(stats.in_flight, seats - stage.running - stage.waiting, now)


@dataclass
class Sent:
    """A request this router sent (or chose to send) to `replica` at `at`."""

    replica: str
    at: float


class Ledger:
    """This router's own view: requests chosen for a replica and not yet accepted
    (`chosen`), accepted and not ended (`open`), and those ended lately (`ended`, with when
    they were sent), so that a report can be brought up to date."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.chosen: dict[str, Sent] = {}
        self.open: dict[str, Sent] = {}
        self.ended: dict[str, tuple[Sent, float]] = {}

    def reserve(self, request: str, replica: str) -> None:
        self.chosen[request] = Sent(replica, self.clock())

    def routed(self, request: str, replica: str) -> None:
        chosen = self.chosen.pop(request, None)
        if request in self.ended:  # ended before its acceptance was heard
            return
        self.open[request] = Sent(replica, chosen.at if chosen else self.clock())

    def completed(self, request: str) -> None:
        """The request ended; where its acceptance was never heard, its reservation says
        where it went, so the report of that replica is still brought up to date."""
        chosen = self.chosen.pop(request, None)
        now = self.clock()
        sent = self.open.pop(request, None) or chosen or Sent("", now)
        self.ended[request] = (sent, now)
        for name in [n for n, (_, t) in self.ended.items() if now - t > STALE_S]:
            del self.ended[name]

    def forget(self, replica: str) -> None:
        """A replica that died: nothing it held counts any more."""
        for book in (self.chosen, self.open):
            for name in [n for n, s in book.items() if s.replica == replica]:
                del book[name]

    def outstanding(self, replica: str, now: float, since: float = float("-inf")) -> int:
        """Requests sent to `replica` after `since` and not ended (fresh reservations too)."""
        held = [s for s in self.open.values() if s.replica == replica and s.at > since]
        chosen = [
            s
            for s in self.chosen.values()
            if s.replica == replica and s.at > since and now - s.at <= RESERVE_S
        ]
        return len(held) + len(chosen)

    def load(self, replica: str, gauges: Gauges | None, now: float) -> tuple[int, int] | None:
        """(free seats, in flight) as of now: the report, plus what was sent to the replica
        after it, less what was sent before it and has ended since; never below this
        router's own count. None when the report is missing or stale."""
        if gauges is None or now - gauges.at > STALE_S:
            return None
        ended = sum(
            1
            for sent, t in self.ended.values()
            if sent.replica == replica and sent.at <= gauges.at < t
        )
        delta = self.outstanding(replica, now, since=gauges.at) - ended
        in_flight = max(gauges.in_flight + delta, self.outstanding(replica, now))
        return gauges.free_seats - (in_flight - gauges.in_flight), in_flight


def rank(
    ledger: Ledger,
    replicas: Sequence[tuple[str, Gauges | None]],
    now: float,
    rng: random.Random | None = None,
) -> list[str]:
    """Replica names, least loaded first: most free seats, then fewest in flight, by the
    replicas' reports brought up to date; where any report is missing or stale, fewest of
    this router's own outstanding requests. Ties in random order."""
    order = list(replicas)
    (rng or random).shuffle(order)
    loads = [ledger.load(name, gauges, now) for name, gauges in order]
    fresh = [load for load in loads if load is not None]
    if len(fresh) == len(loads):
        keys = [(-free, in_flight) for free, in_flight in fresh]
    else:
        keys = [(0, ledger.outstanding(name, now)) for name, _ in order]
    ranked = sorted(range(len(order)), key=keys.__getitem__)  # stable: ties stay shuffled
    return [order[i][0] for i in ranked]
