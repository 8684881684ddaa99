"""The load generator's child process (`load_in_child`) and the request bar drawn beside
it from the server's own count (`RequestBar`), for every bench job and target."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from omniflow.bench.client import completed
from omniflow.bench.outcome import Outcome, read_samples
from omniflow.logs import BAR_DISABLE


def load_in_child(args: list[str], bar: RequestBar | None = None) -> Outcome:
    """Run `omniflow.bench.client` with `args` in a child process; its samples, failures and
    wall time. A failed request is in the outcome; a failing child (e.g. its warm-up) raises.

    With `bar`, the progress bar is drawn here, from the server's count of finished requests,
    and the child draws none (TQDM_DISABLE): a bar of the child's own, on the same stderr,
    is one this process's log lines cannot print above (they ran into it, on a terminal and
    in a file). Without, the child's bar goes to this process's stderr. Its stdout (a
    summary) is dropped, since `omniflow bench` prints the job's own summary there."""
    with tempfile.TemporaryDirectory(prefix="omniflow-bench-") as tmp:
        out = Path(tmp) / "samples.json"
        cmd = [sys.executable, "-m", "omniflow.bench.client", *args, f"--out={out}"]
        env = None if bar is None else {**os.environ, "TQDM_DISABLE": "1"}
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
        try:
            with bar if bar is not None else contextlib.nullcontext():
                while True:
                    try:
                        child.wait(timeout=BAR_POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        if bar is not None:
                            bar.poll()
        finally:  # (an interrupted job leaves no load generator behind)
            if child.poll() is None:
                child.kill()
                child.wait()
        if not completed(child.returncode, out):
            raise RuntimeError(f"the load generator failed (exit {child.returncode}): {cmd}")
        return read_samples(out)


BAR_POLL_S = 0.2
"""How often the request bar reads the server's count."""


class RequestBar:
    """A progress bar over `total` requests, counted by the server's finished-request
    counter (`finished()`: `omniflow_requests_total`, every outcome, all replicas) from when
    the bar is opened; drawn on a terminal only (logs.BAR_DISABLE), cleared when it closes
    (the round's log line then says what it did). An undrawn bar reads nothing: under
    deploy=ray each reading is an HTTP request to the replicas being measured."""

    def __init__(self, finished: Callable[[], int], total: int, desc: str) -> None:
        self.finished, self.total, self.desc = finished, total, desc
        self.bar: tqdm | None = None
        self.start = 0

    def __enter__(self) -> RequestBar:
        self.bar = tqdm(
            total=self.total,
            desc=self.desc,
            unit=" req",
            leave=False,
            file=sys.stderr,
            disable=BAR_DISABLE,
        )
        if not self.bar.disable:
            self.start = self.finished()
        return self

    def poll(self) -> None:
        assert self.bar is not None
        if self.bar.disable:
            return
        done = min(self.finished() - self.start, self.total)
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def __exit__(self, *exc: object) -> None:
        assert self.bar is not None
        self.bar.close()
