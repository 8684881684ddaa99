"""The engine's word to a running window that a request has arrived which the next step
could seat: the window ends at its next step boundary, so the arrival is prefilled then and
not after the whole window (its tokens are unchanged: a shorter window is still exact)."""

from __future__ import annotations

import threading


class Arrivals:
    """Set from any thread when an admissible request arrives; cleared by the engine thread
    before it reads its inbox (so an arrival after that sets it again, never lost)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def notify(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def pending(self) -> bool:
        return self._event.is_set()
