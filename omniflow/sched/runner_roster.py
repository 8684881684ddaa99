"""The AR scheduler's record of which requests the runner holds state for, so each plan
sends a request's full state once and tells the runner which ones to drop."""

from __future__ import annotations


class RunnerRoster:
    """Requests known to the runner, and those whose runner-side state goes with the next plan."""

    def __init__(self) -> None:
        self._known: set[str] = set()
        self._drop: set[str] = set()
        """Requests whose runner-side state must go with the next plan."""
        self._preempted: set[str] = set()
        """Of those, the preempted ones: the runner parks their model state."""

    def knows(self, request_id: str) -> bool:
        return request_id in self._known

    def introduce(self, request_id: str) -> None:
        """The plan being built carries the request's full state."""
        self._known.add(request_id)

    @property
    def has_drops(self) -> bool:
        """Runner-side state still to release (a step delivers it)."""
        return bool(self._drop)

    def preempt(self, request_id: str) -> None:
        if request_id in self._known:
            self._preempted.add(request_id)
        self._forget(request_id)

    def finish(self, request_id: str) -> None:
        self._preempted.discard(request_id)
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        """The next plan tells the runner to drop the request (a preempted one included: its
        parked model state must go when it finishes without resuming)."""
        self._known.discard(request_id)
        self._drop.add(request_id)

    def take_drops(self) -> tuple[frozenset[str], frozenset[str]]:
        """(dropped, preempted among them) for the plan being built; cleared for the next."""
        dropped = frozenset(self._drop)
        preempted = frozenset(self._preempted & dropped)
        self._drop.clear()
        self._preempted.clear()
        return dropped, preempted
