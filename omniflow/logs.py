"""One log format for every logger of an omniflow process (omniflow's and uvicorn's).

`setup_logging(level)` sets the root handler and omniflow's level (`server.log_level` for
`serve`); `UVICORN_LOG_CONFIG` is the dictConfig that makes uvicorn's loggers use the same
format instead of its own (`uvicorn.Config(log_config=UVICORN_LOG_CONFIG)`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """Root handler on stderr with LOG_FORMAT; omniflow's loggers at `level`."""
    numeric = logging.getLevelName(level.upper())
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(numeric)
    logging.getLogger("omniflow").setLevel(numeric)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


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
