"""Log lines print above the progress bars, never into them (README, "Logging"; issue 36)."""

from __future__ import annotations

import io
import logging

from tqdm import tqdm

from omniflow.logs import BAR_DISABLE, LOG_FORMAT, BarAwareHandler


def test_a_log_line_prints_above_a_drawn_bar():
    stream = io.StringIO()
    handler = BarAwareHandler(stream)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log = logging.getLogger("omniflow.test_logs")
    log.addHandler(handler)
    log.propagate = False
    try:
        with tqdm(total=4, desc="requests", file=stream, disable=False) as bar:
            bar.update(1)
            log.warning("round 1/2: a line of its own")
            bar.update(1)
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    (line,) = [row for row in text.split("\n") if "a line of its own" in row]
    # the bar's frame was cleared (a carriage return) before the line, which starts there
    assert line.rsplit("\r", 1)[-1].split(" ", 2)[2].startswith("WARNING omniflow.test_logs")
    assert "requests:" not in line.rsplit("\r", 1)[-1]


def test_bars_are_not_drawn_into_a_file():
    with tqdm(total=2, file=io.StringIO(), disable=BAR_DISABLE) as bar:
        assert bar.disable


def test_torchs_info_lines_stay_out_of_omniflows_log():
    """torch logs at INFO at exit (FakeTensor cache stats) through the root handler: with
    omniflow at info, torch's loggers stay at warning; at debug too (they are not ours)."""
    from omniflow.logs import setup_logging

    torch_log, before = logging.getLogger("torch"), logging.getLogger("torch").level
    try:
        setup_logging("info")
        assert not torch_log.isEnabledFor(logging.INFO)
        assert torch_log.isEnabledFor(logging.WARNING)
        setup_logging("error")
        assert not torch_log.isEnabledFor(logging.WARNING)
    finally:
        torch_log.setLevel(before)
        setup_logging("info")
