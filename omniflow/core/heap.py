"""Giving the C allocator's free heap back to the system once a process goes idle.

glibc's malloc keeps memory a process has freed (in its arenas, one per thread that
allocates, for reuse) rather than returning it, so after a load a process's resident memory
is its peak working set plus retained free heap, not what it uses (docs/reliability.md,
"Resident memory"). `malloc_trim(0)` returns those free pages in one short call, and
`IdleRelease` calls it once a process's requests go idle: the server's (`serve/run.py`, told
by its metrics) and an engine's in a process of its own (`engine/process_child.py`).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable

IDLE_TRIM_S = 10.0
"""Seconds without a running request before the free heap is returned: long enough that a
steady trickle of requests (one a second) does not hand memory back between requests only
to take it again, short enough that a process left idle soon gives it back. Whether the
request after a trim pays for it: `benchmarks/after_trim.py` (docs/performance.md)."""


def malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`; None where the C library has none (musl, macOS), whose
    allocators return memory by themselves or not at all."""
    try:
        return functools.partial(ctypes.CDLL(None).malloc_trim, 0)
    except AttributeError:
        return None


class IdleRelease:
    """Calls `release` on a timer thread once `idle_s` have passed with no request running:
    `busy` when one starts, `idle` when it ends (from any thread; the server's metrics call
    them as the first starts and the last ends, `serve/metrics.py` `Activity`). A request
    that starts meanwhile cancels the timer, so a trim never competes with a request's
    allocations, and one idle spell releases once."""

    def __init__(self, release: Callable[[], object] | None, idle_s: float) -> None:
        self.release, self.idle_s = release, idle_s
        self._running = 0
        self._timer: threading.Timer | None = None
        self._armings = 0
        """Timers armed so far: a timer that fires after a later one was armed does nothing."""
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        """Whether a release is waiting for its idle time."""
        return self._timer is not None

    def busy(self) -> None:
        with self._lock:
            self._running += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def idle(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running or self.release is None:
                return
            self._armings += 1
            self._timer = threading.Timer(self.idle_s, self._run, args=(self._armings,))
            self._timer.daemon = True
            self._timer.start()

    def _run(self, arming: int) -> None:
        with self._lock:
            if self._running or arming != self._armings:  # a start raced the expiry
                return
            self._timer = None
        assert self.release is not None
        self.release()
