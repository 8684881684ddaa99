"""Single steps' frames held on the device and decoded several steps at a time
(`StepPlan.audio_later`, `sched/audio_cycle.py`): a decoder pass costs nearly as much for one
frame as for several, and a stream with playback slack can wait for its audio.

The held rows are the same in every held step, in one order, so their codes are stacked as
they are (`StreamSlots.queue`) and one set of passes decodes them. A row's frames go in order:
it holds only from a cycle's first step, and whatever it held is decoded before anything it
makes later. It lets go when the plan stops naming it (the cycle's last step), when it ends
(a stop frame, its last token), when a step runs without it, or when it is preempted (before
its decoder state is parked); the PCM of a row that was not in the step goes out with that
step's audio all the same (the engine sends it as an audio-only output).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from omniflow.core.audio import PendingAudio
from omniflow.device.upload import upload_ints
from omniflow.models.interface import FrameSample, SampledStep


class HeldFrames:
    """The frames a stage holds, and the passes released for rows not in a step."""

    def __init__(
        self,
        queue: Callable[[Sequence[SampledStep]], PendingAudio],
        ends: Callable[[str], bool],
    ) -> None:
        self.queue = queue
        """The model's decoder call (`ARModel.queue_audio`)."""
        self.ends = ends
        """Whether a request made its last token in the step just recorded."""
        self.steps: list[SampledStep] = []
        """The held steps, each restricted to `rows`."""
        self.rows: tuple[str, ...] = ()
        self.released: list[PendingAudio] = []
        """Passes queued outside a step (a preemption): they go with the next step's audio."""

    def step(self, step: SampledStep, later: Collection[str]) -> list[PendingAudio]:
        """The passes of `step`'s audio: the rows in `later` hold this step's frame (from the
        cycle's first step on, `rows` only); every other row's held frames and this frame are
        queued now."""
        outputs = zip(step.request_ids, step.sample.outputs, strict=True)
        framed = {r for r, f in outputs if f is not None}
        pool = self.rows if self.steps else step.request_ids
        keep = [r for r in pool if r in later and r in framed and not self.ends(r)]
        parts: list[PendingAudio] = []
        going = [r for r in self.rows if r not in keep]
        with_frame = [r for r in going if r in framed]
        without = [r for r in going if r not in framed]  # a stop frame, or not in the step
        if with_frame:
            parts.append(self.queue([*self._of(with_frame), restrict(step, with_frame)]))
        if without:
            parts.append(self.queue(self._of(without)))
        held = set(self.rows) | set(keep)
        now = [r for r in step.request_ids if r not in held]
        if now:
            parts.append(self.queue([restrict(step, now)]))
        self.steps = [*self._of(keep), restrict(step, keep)] if keep else []
        self.rows = tuple(keep)
        # released passes go first; kept until now, so a failing call above does not lose them
        parts, self.released = [*self.released, *parts], []
        return parts

    def release(self, request_ids: Collection[str]) -> None:
        """Decode now what these rows hold (preempted: before their decoder state is parked);
        the passes go out with the next step's audio."""
        going = [r for r in self.rows if r in request_ids]
        if going:
            self.released.append(self.queue(self._of(going)))
            self.drop(going)

    def release_all(self) -> list[PendingAudio]:
        """Every held frame's passes, with those released before (a window starts)."""
        self.release(self.rows)
        parts, self.released = self.released, []
        return parts

    def drop(self, request_ids: Collection[str]) -> None:
        """Forget these rows' frames (finished: their decoder slot goes)."""
        stay = [r for r in self.rows if r not in request_ids]
        if len(stay) < len(self.rows):
            self.steps = self._of(stay) if stay else []
            self.rows = tuple(stay)

    def _of(self, rows: Sequence[str]) -> list[SampledStep]:
        return [restrict(s, rows) for s in self.steps]


def restrict(step: SampledStep, rows: Sequence[str]) -> SampledStep:
    """`step` with only `rows`, in that order (the step itself when they are all its rows).
    Its codes are selected on the device after `made`, so the copy carries no event: a
    decoder stream waits for the whole step (`StreamSlots._handed_over`)."""
    if tuple(rows) == step.request_ids:
        return step
    where = {r: i for i, r in enumerate(step.request_ids)}
    index = [where[r] for r in rows]
    s = step.sample
    picks = upload_ints(index, s.next_frames.device)
    sample = FrameSample(
        tuple(s.tokens[i] for i in index),
        tuple(s.outputs[i] for i in index),
        s.next_tokens.index_select(0, picks),
        s.next_frames.index_select(0, picks),
    )
    return SampledStep(tuple(rows), sample)
