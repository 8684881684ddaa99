"""`pipeline.runtime=process` faults made in the engine's process (a `sitecustomize` the
engine's interpreter runs, the environment being inherited): a server's process that ends
without a word (SIGKILL, the OOM killer) ends its engine process too, even during the build,
when nothing reads the engine's pipe yet (`engine/process_child.py` `watch_server`); a stop
that fails in the engine still ends its process, the server saying why."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest
import torch

BLOCKED_BUILD = """
import os, threading
_fifo = os.environ.get("OMNIFLOW_TEST_BUILD_FIFO")
if _fifo:
    import omniflow.build.pipeline as _built

    def _blocked(*_args, **_kwargs):
        out = open(_fifo, "w")  # held open until this process ends: the test's EOF
        out.write(f"{os.getpid()}\\n")
        out.flush()
        threading.Event().wait()

    _built.build_context = _blocked  # only the engine process builds in-process

_trims = os.environ.get("OMNIFLOW_TEST_TRIM_FIFO")
if _trims:
    import omniflow.core.heap as _heap

    def _announce():
        with open(_trims, "w") as out:
            out.write("trimmed\\n")

    _heap.malloc_trim = lambda: _announce
    _heap.IDLE_TRIM_S = 0.05

if os.environ.get("OMNIFLOW_TEST_FAIL_STOP"):
    from omniflow.engine.orchestrator import Orchestrator

    _stop = Orchestrator.stop

    def _failing_stop(self):
        _stop(self)
        raise RuntimeError("a stop that failed on purpose")

    Orchestrator.stop = _failing_stop
"""
"""A `sitecustomize` for the server's interpreter and the engine's: with
OMNIFLOW_TEST_BUILD_FIFO the engine's build announces itself on that FIFO, then never ends;
with OMNIFLOW_TEST_FAIL_STOP the pipeline's stop raises once it has stopped; with
OMNIFLOW_TEST_TRIM_FIFO the idle trim announces itself on that FIFO, after 50 ms idle."""

SERVER = """
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph

build_pipeline(build_graph(compose(["platform=cpu", "pipeline.runtime=process"])))
"""


def test_a_server_killed_during_the_build_takes_its_engine_process_along(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKED_BUILD)
    fifo = tmp_path / "build"
    os.mkfifo(fifo)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMNIFLOW_TEST_BUILD_FIFO": str(fifo)}
    server = subprocess.Popen([sys.executable, "-c", SERVER], env=env, stderr=subprocess.PIPE)
    engine = None
    try:
        with opened(fifo, server) as building:  # once the engine's build opens it
            engine = int(building.readline())
            server.kill()
            server.wait()
            ended, _, _ = select.select([building], [], [], 60)
            assert ended, "the engine process outlived its server by 60 s"
            assert building.read() == ""  # EOF: its end of the FIFO closed with it
        engine = None
        assert "the server's process is gone: the engine process exits" in server_log(server)
    finally:
        server.kill()
        if engine is not None:  # left behind (the behaviour under test failed): end it
            os.kill(engine, signal.SIGKILL)


def server_log(server: subprocess.Popen) -> str:
    """The engine's log lines go to the server's stderr (inherited), the engine's last one
    after the server ended: read to the end, which the engine's exit makes."""
    assert server.stderr is not None
    return server.stderr.read().decode()


@contextlib.contextmanager
def opened(fifo: Path, server: subprocess.Popen | None, wait_s: float = 120) -> Iterator[TextIO]:
    """The FIFO open for reading, which waits for its writer: at most `wait_s` (a server or
    engine that failed before the build would leave the test waiting forever)."""
    ends: list[TextIO] = []
    opener = threading.Thread(target=lambda: ends.append(open(fifo)))  # noqa: SIM115 (yielded)
    opener.start()
    opener.join(wait_s)
    if opener.is_alive():
        with open(fifo, "w"):  # the opener's writer, so that it returns
            pass
        opener.join()
        ends[0].close()
        if server is None:
            pytest.fail(f"nothing opened {fifo.name} in {wait_s:g} s")
        server.kill()
        pytest.fail(f"the engine's build never began: {server_log(server)[-2000:]}")
    with ends[0] as building:
        yield building


def test_a_stop_that_fails_in_the_engine_still_ends_its_process(tmp_path, monkeypatch, caplog):
    from omniflow.build.pipeline import build_pipeline
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph

    (tmp_path / "sitecustomize.py").write_text(BLOCKED_BUILD)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the engine's interpreter: spawned after this
    monkeypatch.setenv("OMNIFLOW_TEST_FAIL_STOP", "1")
    pipeline = build_pipeline(build_graph(compose(["platform=cpu", "pipeline.runtime=process"])))
    pipeline.start()
    with caplog.at_level("WARNING", logger="omniflow.engine.process_link"):
        pipeline.stop()
    assert "the engine process's stop failed" in caplog.text
    assert "a stop that failed on purpose" in caplog.text
    assert pipeline.exitcode == 0  # it ended itself, not killed past the stop's wait


@pytest.mark.parametrize("work", ["request", "reference"])
def test_the_engine_process_trims_its_heap_once_its_requests_end(tmp_path, monkeypatch, work):
    """As the server trims its own (`serve/run.py`): the engine's free heap goes back to
    the system after its last request or reference encode ends (`core/heap.py`
    `IdleRelease`)."""
    from omniflow.build.pipeline import build_pipeline
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph
    from tests.factories import Collector, speech

    (tmp_path / "sitecustomize.py").write_text(BLOCKED_BUILD)
    fifo = tmp_path / "trims"
    os.mkfifo(fifo)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the engine's interpreter: spawned after this
    monkeypatch.setenv("OMNIFLOW_TEST_TRIM_FIFO", str(fifo))
    model = "model=qwen3_tts_tiny_base" if work == "reference" else "model=qwen3_tts_tiny"
    spec = compose(["platform=cpu", "pipeline.runtime=process", model])
    pipeline = build_pipeline(build_graph(spec))
    pipeline.start()
    try:
        if work == "reference":
            encoder = pipeline.reference_encoder()
            assert encoder is not None
            encoder.encode(torch.zeros(24000))  # a second of silence at the codec's rate
        else:
            sink = Collector()
            pipeline.submit(speech("short", max_new_tokens=4, ignore_eos=True), sink)
            assert sink.wait(60).events[-1].finish_reason == "length"
        with opened(fifo, None, wait_s=30) as trims:  # the engine, 50 ms after the end
            assert trims.readline() == "trimmed\n"
    finally:
        pipeline.stop()


@pytest.mark.parametrize("death_first", [True, False], ids=["before-begun", "after-begun"])
def test_an_engine_dying_as_its_submit_is_answered_ends_the_request_once(monkeypatch, death_first):
    """The engine accepted a request and died before (or just after) the server took the
    answer in (`EngineLink.begun`): the caller learns it once, either as the submit's
    PipelineUnavailable (its sink then gets no terminal event) or as one error event, and
    nothing stays in flight."""
    from omniflow.build.pipeline import build_pipeline
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph
    from omniflow.core.pipeline import PipelineUnavailable
    from omniflow.engine.process_link import EngineLink
    from tests.factories import Collector, speech
    from tests.stages.test_flow import wait_for

    original = EngineLink.begun

    def begun(link: EngineLink, request_id: str, accepted: bool) -> None:
        if death_first:  # the reader has ended every request it knew before this runs
            link.process.kill()
            wait_for(lambda: link.death is not None)
            original(link, request_id, accepted)
            return
        try:
            original(link, request_id, accepted)
        finally:
            link.process.kill()

    monkeypatch.setattr(EngineLink, "begun", begun)
    pipeline = build_pipeline(build_graph(compose(["platform=cpu", "pipeline.runtime=process"])))
    pipeline.start()
    sink = Collector()
    try:
        if death_first:
            with pytest.raises(PipelineUnavailable, match="engine process exited"):
                pipeline.submit(speech("r", max_new_tokens=4000, ignore_eos=True), sink)
            assert not [e for e in sink.events if e.finished]
        else:
            pipeline.submit(speech("r", max_new_tokens=4000, ignore_eos=True), sink)
            end = sink.wait(30).terminal
            assert end.finish_reason == "error" and "engine process exited" in end.error
        assert pipeline.stats().in_flight == 0
    finally:
        pipeline.stop()
