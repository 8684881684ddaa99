"""A step's audio, still being decoded when the runner answers (`StepResult.late_audio`).

The runner queues the decoder for a step's frames (a window's last chunk, or a single step's
frame) and returns without waiting for the PCM. The engine updates the scheduler with the
step's tokens (lifting a window's fence), then waits for the audio
(`StageEngine._with_late_audio`). Under async scheduling it submits the next plan before that
wait, so the next step's forward and sampling are queued while this step's audio is decoded
and copied to the host: the decoder pass and the host's turn-around between steps stop
sitting on the critical path (at c1 an 8-frame window's decoder pass is ~4 ms of a ~42 ms
window, after its last frame, docs/benchmarks.md). With sync scheduling the wait follows at
once, as before. The PCM is the same either way: only when it is waited for moves.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from omniflow.core.output import StageOutput
from omniflow.core.step import RequestStepOutput, StepResult
from omniflow.models.interface import PendingAudio

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepAudio:
    """The decoder calls of one step, in order (a window's chunks, then the rest)."""

    pending: Sequence[PendingAudio]
    model: str
    """Named in the error a failed decode gives each of the step's requests."""
    step_id: int

    def attach(self, outputs: Mapping[str, RequestStepOutput]) -> dict[str, RequestStepOutput]:
        """The outputs with each request's PCM (its parts joined in order); waits for the
        decoding. A decode that fails ends every request of the step with one error, as a
        failure inside the step does."""
        try:
            parts = [p.result() for p in self.pending]
        except (RuntimeError, ValueError) as exc:
            log.exception("%s step %d: its audio failed", self.model, self.step_id)
            message = f"{self.model} step failed: {exc}"
            return {rid: RequestStepOutput(error=message) for rid in outputs}
        audio: dict[str, list[np.ndarray]] = {}
        for part in parts:
            for rid, pcm in part.items():
                audio.setdefault(rid, []).append(pcm)
        return {
            rid: dataclasses.replace(out, audio=_joined(audio[rid])) if rid in audio else out
            for rid, out in outputs.items()
        }


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def outputs_with_audio(
    outputs: list[StageOutput], result: StepResult
) -> tuple[list[StageOutput], list[tuple[str, str]]]:
    """A step's stage outputs (made from its tokens) with its late audio, waited for now.
    Where the audio failed, the request's output becomes one error terminal instead; the
    second list names (request, error) for those the outputs had not ended, which the caller
    still has to finish in its scheduler."""
    step = result.settled().outputs
    out: list[StageOutput] = []
    failed: list[tuple[str, str]] = []
    for o in outputs:
        got = step.get(o.request_id)
        if got is not None and got.error is not None:
            if not o.finished:
                failed.append((o.request_id, got.error))
            out.append(
                StageOutput(o.request_id, finished=True, finish_reason="error", error=got.error)
            )
        elif got is not None and got.audio is not None:
            out.append(dataclasses.replace(o, audio=got.audio))
        else:
            out.append(o)
    return out, failed
