"""The one pending-audio type: PCM a worker queued for a step (or a window pass) and hands
back by its own call (`Runner.take_audio`), apart from the step's tokens. The engine applies
the tokens first and waits for the audio after it has queued the next step."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class PendingAudio(Protocol):
    """PCM being made on the device."""

    def result(self) -> dict[str, np.ndarray]:
        """PCM per request (float32 samples, mono), once it is made; RuntimeError or
        ValueError when making it failed."""
        ...
