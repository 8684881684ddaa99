"""uvicorn's ERROR lines for what omniflow handles on purpose, made what they are: left out
where omniflow logged its own line with the reason, or one WARNING line instead of a traceback
a client can cause at will (docs/reliability.md).

- "ASGI callable returned without completing response.": after a stream `serve/sending.py`
  ended early on purpose (a stalled client, a broken stream, shutdown), which logged a WARNING
  with the reason; kept for any other end.
- "Invalid UTF-8 sequence received from client.": a WebSocket text frame that is not UTF-8,
  logged with the decoder's traceback; the client is closed with 1007 all the same.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

UVICORN_INCOMPLETE = "ASGI callable returned without completing response."
UVICORN_BAD_UTF8 = "Invalid UTF-8 sequence received from client."
BAD_UTF8_LINE = "a WebSocket client sent a text frame that is not UTF-8: closed (1007)"
_ENDED_ON_PURPOSE: ContextVar[bool] = ContextVar("ended_on_purpose", default=False)
"""Set in a request's task when its stream was ended early on purpose; uvicorn logs the
incomplete response in that same task, after the app returns."""


def mark_ended_on_purpose() -> None:
    """The current request's stream ended early on purpose (called in the request's task)."""
    _ENDED_ON_PURPOSE.set(True)


class UvicornNoise(logging.Filter):
    """Drops or shortens uvicorn's lines for what omniflow handles (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message == UVICORN_INCOMPLETE:
            return not _ENDED_ON_PURPOSE.get()
        if message == UVICORN_BAD_UTF8:
            record.msg, record.args = BAD_UTF8_LINE, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
            # the logger let it through as an ERROR: as a WARNING, only where those pass
            return logging.getLogger(record.name).isEnabledFor(logging.WARNING)
        return True


def install() -> None:
    """`UvicornNoise` on uvicorn's error logger (once)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, UvicornNoise) for f in logger.filters):
        logger.addFilter(UvicornNoise())
