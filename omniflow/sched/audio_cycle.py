"""Which rows' audio may wait a few steps (`audio_pass_steps`, docs/architecture.md: audio
passes over several steps).

Outside windows every step used to decode its one new frame per row at once, and a decoder
pass costs nearly as much for one frame as for several. A cycle of D single steps lets the
rows that were already playing when it began hold their frames and decode them in one pass
at its last step, as a window's audio is; D is what the scheduled streams' playback slack
covers (as for a window) and at most `audio_pass_steps`. New rows, prefills and live rows
decode at once; a row leaves the cycle for good when it is not scheduled or stops decoding,
and the runner decodes what it held then. No window opens while a cycle runs: its audio
would come after the window's steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from omniflow.core.step import StepPlan
from omniflow.sched.playback import PlaybackClock
from omniflow.sched.window import Candidate, prefills


class AudioCycle:
    """The current cycle: its rows and the steps left in it."""

    def __init__(self, steps: int, playback: PlaybackClock | None) -> None:
        self.steps = steps
        """`audio_pass_steps`: the longest cycle (below 2: none)."""
        self.playback = playback
        self.left = 0
        """Steps of the running cycle still to plan (0: none runs)."""
        self.rows: frozenset[str] = frozenset()
        self.cycles = 0
        """Cycles begun (the stage's INFO line and tests)."""
        self.current = 0
        """The cycle of the step planned last (`StepPlan.audio_cycle`; 0: none)."""

    @property
    def running(self) -> bool:
        return self.left > 0

    def plan(self, candidates: Iterable[Candidate], windowed: bool) -> frozenset[str]:
        """The rows of this step whose frame may wait (`StepPlan.audio_later`): none in a
        window, at a cycle's last step, or where slack covers fewer than 2 steps."""
        candidates = list(candidates)
        self.current = 0
        if self.steps < 2 or windowed:
            self.left, self.rows = 0, frozenset()
            return frozenset()
        eligible = frozenset(
            c.request.request_id
            for c in candidates
            if not prefills(c) and c.request.live is None  # live text: its cap moves
        )
        if not self.running:
            length = self._length(candidates)
            if length < 2 or not eligible:
                return frozenset()
            self.left, self.rows = length, eligible
            self.cycles += 1
        self.left -= 1
        self.current = self.cycles
        self.rows = self.rows & eligible  # a row that leaves does not come back this cycle
        if not self.rows:
            self.left = 0  # no one holds: windows may open again
        return frozenset() if self.left == 0 else self.rows

    def stamp(self, plan: StepPlan, later: frozenset[str]) -> StepPlan:
        """`plan` with the rows that may hold and the cycle it belongs to."""
        if not later and not self.current:
            return plan
        return dataclasses.replace(plan, audio_later=later, audio_cycle=self.current)

    def _length(self, candidates: list[Candidate]) -> int:
        """The steps the scheduled streams' slack covers, at most `steps`."""
        if self.playback is None:
            return self.steps
        streams = [(c.request.request_id, len(c.request.output_tokens)) for c in candidates]
        # held frames leave only at the cycle's end, whatever a window's chunks do
        return self.playback.window_steps(self.steps, streams, self.playback.now(), chunked=False)
