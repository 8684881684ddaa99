"""`speed`: the speech made faster or slower without changing its pitch.

A streaming time-scale modification (audiotsm's WSOLA: 32 ms frames overlapped every 8 ms,
each placed where its waveform best continues the last) keeps its input and output buffers
from one chunk to the next, so a streamed response is the same audio as a whole one, with no
seams where the pipeline's chunks join. Why this library and not another (Rubber Band,
librosa, ...): docs/speed.md, with the measured comparison.

The output of a request is exactly round(samples / speed) long: the last frames are flushed
through zeros at the end and the result cut (or padded with silence) to that length; the
integer hops are picked so the stretcher's own ratio is within 0.2 % of `speed` (exact at
the usual speeds), so the cut or the pad is at most that. Speed 1.0 builds nothing: the
audio passes through untouched.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from audiotsm import wsola
from audiotsm.io.array import ArrayReader, ArrayWriter

from omniflow.core.events import AudioEvent
from omniflow.core.request import MAX_SPEED, MIN_SPEED

FRAME_SECONDS = 0.032
"""WSOLA's frame (768 samples at 24 kHz: three periods of a 100 Hz voice), overlapped 4
times. The measured best of the lengths tried on speech-like audio (docs/speed.md); it also
bounds what the stretcher holds back while streaming (tens of milliseconds)."""


def hops(speed: float, frame: int) -> tuple[int, int]:
    """(analysis, synthesis) hops whose ratio is nearest `speed`: audiotsm takes integers,
    and its own int(synthesis * speed) would be off by up to 1/48 at speed 0.25."""
    quarter = frame // 4
    candidates = range(round(quarter * 0.85), round(quarter * 1.15) + 1)

    def error(h: int) -> tuple[float, int]:  # ties: the hop nearest a quarter frame
        return abs(round(h * speed) / (h * speed) - 1), abs(h - quarter)

    synthesis = min(candidates, key=error)
    return max(1, round(synthesis * speed)), synthesis


class TimeStretch:
    """One request's stretcher: `push` its audio as it comes, `finish` at its end."""

    def __init__(self, speed: float, sample_rate: int) -> None:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], not {speed}")
        self.speed = speed
        self.frame = max(64, round(FRAME_SECONDS * sample_rate))
        analysis, synthesis = hops(speed, self.frame)
        self._tsm = wsola(
            1, frame_length=self.frame, analysis_hop=analysis, synthesis_hop=synthesis
        )
        self.taken = 0
        """Input samples pushed so far."""
        self.given = 0
        """Output samples returned so far (never more than round(taken / speed))."""
        self._held = np.zeros(0, np.float32)
        """Output made but not yet due (kept so the total is exactly the target length)."""

    @staticmethod
    def of(speed: float, sample_rate: int) -> TimeStretch | None:
        """The stretcher for `speed`; None at 1.0, where the audio passes untouched."""
        return None if speed == 1.0 else TimeStretch(speed, sample_rate)

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """`pcm` in, the stretched audio that is ready out (possibly none yet)."""
        self.taken += pcm.size
        return self._release(self._run(pcm, flush=False), round(self.taken / self.speed))

    def finish(self) -> np.ndarray:
        """The rest: the frames still in the stretcher, flushed, to the exact length."""
        tail = self._run(np.zeros(2 * self.frame, np.float32), flush=True)
        target = round(self.taken / self.speed)
        out = self._release(tail, target)
        short = target - self.given
        if short > 0:  # the stretcher gave less than the target: end with silence
            out = np.concatenate([out, np.zeros(short, np.float32)])
            self.given = target
        return out

    def _run(self, pcm: np.ndarray, flush: bool) -> np.ndarray:
        writer = ArrayWriter(1)
        self._tsm.run(ArrayReader(pcm.reshape(1, -1)), writer, flush=flush)
        return writer.data[0].astype(np.float32, copy=False)

    def _release(self, made: np.ndarray, limit: int) -> np.ndarray:
        held = np.concatenate([self._held, made]) if self._held.size else made
        n = max(0, min(held.size, limit - self.given))
        self._held = held[n:]
        self.given += n
        return held[:n]


def stretch(pcm: np.ndarray, speed: float, sample_rate: int) -> np.ndarray:
    """A whole recording at `speed` (`pcm` itself at 1.0)."""
    stretcher = TimeStretch.of(speed, sample_rate)
    if stretcher is None:
        return pcm
    return np.concatenate([stretcher.push(pcm), stretcher.finish()])


def stretch_event(stretcher: TimeStretch | None, ev: AudioEvent) -> AudioEvent:
    """`ev` with its audio stretched; the last event also carries the stretcher's tail. An
    event whose stretched audio is empty (the stretcher still fills its first frame) carries
    none. A request that ended in an error gets no tail (its response is broken anyway)."""
    if stretcher is None:
        return ev
    parts = [stretcher.push(ev.pcm)] if ev.pcm is not None else []
    if ev.finished and not ev.error:
        parts.append(stretcher.finish())
    pcm = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else None
    return dataclasses.replace(ev, pcm=pcm if pcm is not None and pcm.size else None)
