"""Giving the C allocator's free memory back to the system when the server goes idle.

glibc's malloc keeps memory that the process has freed (in its arenas, one per thread that
allocates, for reuse) rather than returning it to the system, so the server's resident
memory after a load is its peak working set plus fragmentation, not what it uses: in the
soak (docs/reliability.md, "Resident memory") the objects and tensors in use stay flat from
round to round while resident memory levels off above them in free, retained heap.
`malloc_trim(0)` returns those free pages (all arenas, in one short call);
`IdleTrim` calls it on a worker thread once no request has run for `IDLE_TRIM_S`, so that
it never competes with a request's allocations and never runs twice for one idle spell.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable

IDLE_TRIM_S = 1.0
"""Seconds without a running request before the free heap is returned."""


def malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`; None where the C library has none (musl, macOS), whose
    allocators return memory by themselves or not at all."""
    try:
        return functools.partial(ctypes.CDLL(None).malloc_trim, 0)
    except AttributeError:
        return None


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
