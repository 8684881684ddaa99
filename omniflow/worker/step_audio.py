"""A step's audio as one pending value: the decoder calls of a step (a window's chunks, then
the rest) joined per request, waited for by whoever takes it (`Runner.take_audio`).

The runner queues the decoder and returns the step's tokens without waiting for the PCM, so
under async scheduling the engine queues the next step before it waits for this one's audio
and the decoder pass stops sitting on the critical path. The PCM is the same either way:
only when it is waited for moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from omniflow.core.audio import AudioFailed, PendingAudio


@dataclasses.dataclass(frozen=True)
class StepAudio:
    """The decoder calls of one step, in order; a `PendingAudio` itself."""

    pending: Sequence[PendingAudio]
    model: str
    """Named in the error a failed decode raises."""
    step_id: int
    silent: frozenset[str] = frozenset()
    """Rows decoded ahead of the read-back that drew the stop token (`StepOps.audio_ahead`):
    their samples are not audio, and a reduced-precision overflow in them is no error."""

    def result(self) -> dict[str, np.ndarray]:
        """Each request's PCM, its parts joined in order (waits for the decoding);
        `AudioFailed` names the requests a part could not make, with the others' PCM."""
        parts: list[dict[str, np.ndarray]] = []
        errors: dict[str, str] = {}
        for pending in self.pending:
            try:
                parts.append(pending.result())
            except AudioFailed as exc:
                errors.update((r, m) for r, m in exc.errors.items() if r not in self.silent)
                parts.append(exc.pcm)
            except (RuntimeError, ValueError) as exc:
                raise RuntimeError(f"{self.model} step failed: {exc}") from exc
        audio: dict[str, list[np.ndarray]] = {}
        for part in parts:
            for rid, pcm in part.items():
                audio.setdefault(rid, []).append(pcm)
        joined = {
            rid: p[0] if len(p) == 1 else np.concatenate(p)
            for rid, p in audio.items()
            if rid not in errors  # a request missing a part has no whole audio
            and rid not in self.silent
        }
        if errors:
            raise AudioFailed(errors, joined)
        return joined
