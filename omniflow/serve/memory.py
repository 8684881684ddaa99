"""The server's idle trim: its free C heap back to the system once its requests go idle
(why: `core/heap.py`). `IdleTrim` calls `malloc_trim` on a worker thread once no request has
run for `IDLE_TRIM_S`, so that it never competes with a request's allocations and never runs
twice for one idle spell; it runs on the event loop (`busy` / `idle` from the metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class IdleTrim:
    """Calls `release` once each time the server has been idle for `idle_s` (`busy` when a
    request starts, `idle` when the last running one ends; both on the event loop)."""

    def __init__(self, release: Callable[[], object] | None, idle_s: float) -> None:
        self.release, self.idle_s = release, idle_s
        self._timer: asyncio.TimerHandle | None = None

    def busy(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def idle(self) -> None:
        if self.release is None:
            return
        self.busy()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.idle_s, self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self.release is not None:
            # A worker thread: ctypes releases the GIL, the event loop keeps serving.
            loop.run_in_executor(None, self.release)
