"""What every replica last said about itself (its `/health` answer and its `/metrics`
text), kept in one Ray actor so that `/health` and `/metrics` through any replica cover
all of them (deploy/overview.py answers them).

Each replica reports every `REPORT_S` seconds from a thread of its own (`Reporter`); a
replica not heard from for `STALE_S` is shown as unreachable (it died, or is being
restarted: Ray Serve starts a new one, under a new id), and forgotten after `FORGET_S`. A
replica that stops cleanly is forgotten at once."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

REPORT_S = 1.0
STALE_S = 3.0
FORGET_S = 60.0


@dataclass(frozen=True)
class Report:
    """One replica's state: its /health body and status code, its /metrics text, and how
    many seconds ago it said so."""

    health: dict
    status_code: int
    metrics: str
    age_s: float


@ray.remote(num_cpus=0)
class Board:
    """The replicas' last reports, by replica id."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[dict, int, str, float]] = {}

    def report(self, name: str, health: dict, status_code: int, metrics: str) -> None:
        self.reports[name] = (health, status_code, metrics, time.monotonic())

    def forget(self, name: str) -> None:
        self.reports.pop(name, None)

    def snapshot(self) -> dict[str, Report]:
        now = time.monotonic()
        for name in [n for n, r in self.reports.items() if now - r[3] > FORGET_S]:
            del self.reports[name]
        return {n: Report(h, c, m, now - t) for n, (h, c, m, t) in self.reports.items()}


def new_board() -> Any:
    return Board.remote()


class Reporter:
    """A replica's thread sending `state()` (health body, status code, metrics text) to the
    board every `REPORT_S`, until `stop()` (which also has the board forget the replica)."""

    def __init__(self, board: Any, name: str, state: Callable[[], tuple[dict, int, str]]) -> None:
        self.board, self.name, self.state = board, name, state
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="omniflow-board", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            # a board that cannot be reached leaves a stale report, not a dead replica
            with contextlib.suppress(ray.exceptions.RayError):
                self.board.report.remote(self.name, *self.state())
            self.done.wait(REPORT_S)

    def stop(self) -> None:
        self.done.set()
        self.board.forget.remote(self.name)


def health_of(response: Any) -> tuple[dict, int]:
    """A JSONResponse's body and status code."""
    return json.loads(response.body), response.status_code
