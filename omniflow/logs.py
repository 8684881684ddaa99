"""One log format for every logger of an omniflow process (omniflow's and uvicorn's), and
log lines that print above the progress bars, never into them.

`setup_logging(level)` sets the root handler and omniflow's level (`server.log_level` for
`serve`); `UVICORN_LOG_CONFIG` is the dictConfig that makes uvicorn's loggers use the same
format instead of its own (`uvicorn.Config(log_config=UVICORN_LOG_CONFIG)`). The handler
(`BarAwareHandler`, also a sweep job's console handler: conf/hydra/job_logging) writes a line
through tqdm while a bar is drawn in this process: the bar is cleared, the line written on
its own, the bar drawn again below it. Bars are drawn only on a terminal (`BAR_DISABLE`): in a
file they would be carriage-return frames with a log line run into the last one.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm import tqdm

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
BAR_DISABLE = None
"""tqdm's `disable` for omniflow's bars: None draws them only where the stream is a terminal."""


class BarAwareHandler(logging.StreamHandler):
    """A stream handler whose lines print above this process's progress bars."""

    def emit(self, record: logging.LogRecord) -> None:
        try:  # tqdm.write clears and redraws any bars; with none it is a plain write
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except (OSError, ValueError):  # logging's contract: a failing handler reports it
            self.handleError(record)


def setup_logging(level: str) -> None:
    """Root handler on stderr with LOG_FORMAT; omniflow's loggers at `level`."""
    numeric = logging.getLevelName(level.upper())
    root = logging.getLogger()
    if not root.handlers:
        handler = BarAwareHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(numeric)
    logging.getLogger("omniflow").setLevel(numeric)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    # torch's own INFO lines (FakeTensor cache stats at exit) under omniflow's format read as ours
    logging.getLogger("torch").setLevel(max(numeric, logging.WARNING))


UVICORN_LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {
        # no handlers of their own: records go to the root handler, in LOG_FORMAT
        "uvicorn": {"handlers": [], "propagate": True},
        "uvicorn.error": {"handlers": [], "propagate": True},
        "uvicorn.access": {"handlers": [], "propagate": True},
    },
}
