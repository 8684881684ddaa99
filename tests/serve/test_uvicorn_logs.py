"""uvicorn's lines for what omniflow handles (`serve/uvicorn_logs.py`): the shortened
invalid-UTF-8 line obeys the logger's level like any WARNING."""

from __future__ import annotations

import logging

from omniflow.serve.uvicorn_logs import BAD_UTF8_LINE, UVICORN_BAD_UTF8, UvicornNoise


def bad_utf8() -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, UVICORN_BAD_UTF8, None, None)


def test_the_invalid_utf8_line_is_a_warning_only_where_warnings_pass():
    logger = logging.getLogger("uvicorn.error")
    before = logger.level
    try:
        logger.setLevel(logging.WARNING)
        record = bad_utf8()
        assert UvicornNoise().filter(record) and record.getMessage() == BAD_UTF8_LINE
        assert record.levelname == "WARNING" and record.exc_info is None
        logger.setLevel(logging.ERROR)  # server.log_level=error: an ERROR passed, a WARNING not
        assert not UvicornNoise().filter(bad_utf8())
    finally:
        logger.setLevel(before)
