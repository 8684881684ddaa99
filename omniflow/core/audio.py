"""The one pending-audio type: PCM a worker queued for a step (or a window pass) and hands
back by its own call (`Runner.take_audio`), apart from the step's tokens. The engine applies
the tokens first and waits for the audio after it has queued the next step."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class PendingAudio(Protocol):
    """PCM being made on the device."""

    def result(self) -> dict[str, np.ndarray]:
        """PCM per request (float32 samples, mono), once it is made; `AudioFailed` when some
        requests' audio is unusable (the others' comes with it), RuntimeError or ValueError
        when making it failed as a whole."""
        ...


class AudioFailed(ValueError):
    """Some requests' audio of a step is unusable (a reduced-precision decoder overflowed in
    their rows): `errors` says why per request; `pcm` is every other request's audio, which
    is good, so one bad row does not end its neighbours."""

    def __init__(self, errors: dict[str, str], pcm: dict[str, np.ndarray]) -> None:
        super().__init__("; ".join(sorted(set(errors.values()))))
        self.errors = errors
        self.pcm = pcm

    def __reduce__(self) -> tuple[type[AudioFailed], tuple[dict[str, str], dict[str, np.ndarray]]]:
        return AudioFailed, (self.errors, self.pcm)  # it pickles whole (a process boundary)
