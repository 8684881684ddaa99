"""Which rows' audio may wait a few steps (`audio_pass_steps`, docs/architecture.md: audio
passes over several steps).

Outside windows every step used to decode its one new frame per row at once, and a decoder
pass costs nearly as much for one frame as for several. A cycle of L single steps lets the
rows that were already playing when it began, and whose own playback slack covers L steps,
hold their frames and decode them in one pass at its last step, as a window's audio is
(L at most `audio_pass_steps`, `_hold`). New rows, prefills, live rows and rows without the
slack decode at once; a row leaves the cycle for good when it is not scheduled or stops
decoding, and the runner decodes what it held then. No window opens while a cycle runs: its
audio would come after the window's steps.
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
        self.due: float | None = None
        """When the held rows' first held frame is due (the least slack at the cycle's start;
        None: no clock)."""

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
            length, rows, self.due = self._hold(candidates, eligible)
            if length < 2 or not rows:
                return frozenset()
            self.left, self.rows = length, rows
            self.cycles += 1
        elif self._late(len(candidates)):
            self.left = 1  # the steps grew (arrivals seated beside): what is held goes now
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

    def _late(self, rows: int) -> bool:
        """Whether the cycle's remaining steps, at the step time of `rows` rows now, would
        take its held audio past when it is due (the slack it was sized with is spent as
        time passes, whatever frames the held rows made since)."""
        if self.playback is None or self.due is None:
            return False
        step = self.playback.step_s_at(rows)
        return step is not None and self.due - self.playback.now() < self.left * step

    def _hold(
        self, candidates: list[Candidate], eligible: frozenset[str]
    ) -> tuple[int, frozenset[str], float | None]:
        """The cycle's length L and rows: those whose own playback slack covers L steps at the
        measured step time, L (2 to `steps`) chosen to save the most decoder work (rows held
        x (1 - 1/L): a pass per L steps instead of one a step). A row that cannot wait decodes
        at once, and its slack does not shorten the others' cycle. No clock: every eligible
        row, `steps` steps."""
        if self.playback is None:
            return self.steps, eligible, None
        clock, at = self.playback, self.playback.now()
        step = clock.step_s_at(len(candidates))
        if step is None:
            return 0, frozenset(), None  # nothing measured yet: no one waits on a guess
        frames = {c.request.request_id: len(c.request.output_tokens) for c in candidates}
        slack = {r: clock.window_slack(r, frames[r], at) for r in eligible}
        fits = {r: int(s // step) for r, s in slack.items()}
        saved = {
            n: sum(f >= n for f in fits.values()) * (1 - 1 / n) for n in range(2, self.steps + 1)
        }
        length = max(saved, key=lambda n: (saved[n], n))  # `plan` asks only with steps >= 2
        if saved[length] == 0:
            return 0, frozenset(), None
        rows = frozenset(r for r, f in fits.items() if f >= length)
        return length, rows, at + min(slack[r] for r in rows)
