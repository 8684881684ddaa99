"""The Ray deployment a `deploy=ray` bench job keeps for the sweep's next job
(`bench.reuse_pipeline`), as bench/reuse.py keeps an in-process pipeline: starting the
replicas is most of a job (each builds the whole pipeline). No Ray import here: an
in-process job stops a kept deployment without needing Ray itself."""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Stop = Callable[[], None]


class KeptDeployment:
    """The last job's running deployment: the settings it was started with, its URL and
    how to take it down."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.url: str | None = None
        self.stop: Stop | None = None

    def get(self, key: str, start: Callable[[], tuple[str, Stop]]) -> tuple[str, bool]:
        """The URL of a deployment started with `key`'s settings, and whether it was kept
        from an earlier job (else `start()`ed now, stopping any other first)."""
        if self.url is not None and key == self.key:
            log.info("reusing the Ray deployment the previous job started (bench.reuse_pipeline)")
            return self.url, True
        self.close()
        url, stop = start()
        self.key, self.url, self.stop = key, url, stop
        return url, False

    def close(self) -> None:
        """Take the kept deployment down (nothing when none is kept)."""
        if self.stop is None:
            return
        stop, self.key, self.url, self.stop = self.stop, None, None, None
        stop()


KEPT = KeptDeployment()
atexit.register(KEPT.close)
