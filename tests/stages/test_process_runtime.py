"""`pipeline.runtime=process` (`engine/process_pipeline.py`): the pipeline in a process of its
own answers as the in-process one does. Seeded audio bit for bit; refusals raised here with
their type and message; an abort returns after its terminal event; flow control pauses and
resumes through the pipe; live text; step times; reference encoding; a build failure raised
here; a dead engine process ends its requests with one error each and refuses new ones;
`omniflow serve`'s HTTP path over it gives the in-process bytes.

Each engine process costs an interpreter start and a build (~2-3 s on two cores), so the
checks that can share one run on one process (`test_one_engine_process_answers_as_in_process`).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue
import re
import signal
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest
import torch

from omniflow.bench.step_kinds import StepKindTimer
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import NoTimer, Overloaded, PipelineUnavailable, RequestLimits
from omniflow.engine.process_child import SENDER_FAILED, Calls, Outbox, messages
from omniflow.engine.process_pipeline import ProcessPipeline
from omniflow.engine.process_wire import (
    OBSERVED,
    Control,
    Encode,
    Failure,
    Reply,
    Submit,
    pack,
    receive,
    send,
    unpack,
)
from omniflow.errors import ConfigError, ConfigErrors
from omniflow.serve.run import ServerThread
from tests.factories import Collector, FirstAudio, build, speech
from tests.stages.test_flow import Reader, wait_for

FUSED = ("platform=cpu", "pipeline=qwen3_tts_fused")
M = re.MULTILINE
PROCESS = "pipeline.runtime=process"
SPF = 1920


def process_pipeline(*overrides: str) -> ProcessPipeline:
    pipeline = build_pipeline(build_graph(compose([*FUSED, PROCESS, *overrides])))
    assert isinstance(pipeline, ProcessPipeline)
    return pipeline


def run(pipeline, *requests) -> list[Collector]:
    """One request at a time: a step's rows are the same on both sides, so are its sums."""
    sinks = []
    for request in requests:
        sinks.append(Collector())
        pipeline.submit(request, sinks[-1])
        sinks[-1].wait()
    return sinks


def test_one_engine_process_answers_as_in_process():
    requests = [
        speech("a", "Hello there, you.", seed=3, max_new_tokens=24, ignore_eos=True),
        speech("b", "A second voice speaks.", seed=4, max_new_tokens=17, ignore_eos=True),
    ]
    local = build(FUSED[1].split("=")[1])
    try:
        want = run(local, *requests)
        info = local.info()
    finally:
        local.stop()
    remote = process_pipeline()
    steps: list[tuple[str, float]] = []
    remote.set_step_observer(lambda stage, s: steps.append((stage, s)))
    remote.start()
    try:
        assert remote.info() == dataclasses.replace(info, engine_pid=remote.pid)
        assert info.engine_pid is None and remote.pid != os.getpid()
        got = run(remote, *requests)
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g.pcm, w.pcm) and g.pcm.size == w.pcm.size > 0
            assert [e.frames for e in g.events] == [e.frames for e in w.events]
            assert g.terminal.finish_reason == w.terminal.finish_reason == "length"
            seated = [e.seated_at is not None for e in g.events]
            assert seated == [e.seated_at is not None for e in w.events] and any(seated)
        assert steps and {stage for stage, _ in steps} == {"talker"}
        assert all(s > 0 for _, s in steps)
        os.kill(remote.pid, signal.SIGTERM)  # a process group's SIGTERM: the server's to handle
        assert np.array_equal(run(remote, requests[0])[0].pcm, want[0].pcm)
        check_refusals(remote)
        check_a_sink_may_abort_its_own_request(remote)
        check_abort_returns_after_its_terminal_event(remote)
        check_flow_control_pauses_and_resumes(remote, want[0].pcm)
        check_live_text(remote)
        check_step_phases_are_timed_there_and_handed_over(remote)
        stats = remote.stats()
        assert stats.healthy and stats.in_flight == 0 and stats.stages[0].name == "talker"
        assert remote.reference_encoder() is None  # CustomVoice: no encoders
    finally:
        remote.stop()
    assert remote.exitcode == 0


def check_refusals(remote: ProcessPipeline) -> None:
    with pytest.raises(ValueError, match=r"^unknown voice 'nobody'"):
        remote.submit(speech("bad", voice="nobody"), Collector())
    with pytest.raises(ValueError, match="^input is 20010 prompt tokens; max_model_len is 4096"):
        remote.submit(speech("long", "x" * 20000), Collector())
    # a bug's error (here text=None): that request's error, released; the engine goes on
    with pytest.raises(RuntimeError, match="^in the engine process: TypeError"):
        remote.submit(speech("buggy", text=None), Collector())
    assert remote.stats().in_flight == 0 and remote.stats().healthy
    again = run(remote, speech("buggy", max_new_tokens=3, ignore_eos=True))[0]
    assert again.terminal.finish_reason == "length"


def check_a_sink_may_abort_its_own_request(remote: ProcessPipeline) -> None:
    """A sink runs on the reader thread, which alone takes the engine's replies: an abort
    from there must not wait for one (in-process it is applied at once)."""

    class Aborting(Collector):
        def __call__(self, event) -> None:
            super().__call__(event)
            if event.pcm is not None and len(self.events) == 1:
                remote.abort("self-abort")

    sink = Aborting()
    remote.submit(speech("self-abort", max_new_tokens=400, ignore_eos=True), sink)
    assert sink.wait(30).terminal.finish_reason == "abort"
    assert remote.stats().in_flight == 0


def check_abort_returns_after_its_terminal_event(remote: ProcessPipeline) -> None:
    sink = FirstAudio()
    remote.submit(speech("long", max_new_tokens=400, ignore_eos=True), sink)
    assert sink.started.wait(30)
    remote.abort("long")
    assert sink.done.is_set()  # on return, not later
    assert sink.terminal.finish_reason == "abort"
    remote.abort("long")  # an ended request: nothing happens
    assert len([e for e in sink.events if e.finished]) == 1


def check_flow_control_pauses_and_resumes(remote: ProcessPipeline, want: np.ndarray) -> None:
    reader = Reader(remote, "a")  # request "a" again, flow-controlled this time
    request = speech("a", "Hello there, you.", seed=3, max_new_tokens=24, ignore_eos=True)
    remote.submit(request, reader, RequestLimits(max_buffered_s=0.5))
    wait_for(lambda: remote.stats().stages[0].paused == 1)
    assert not reader.done.is_set() and 0 < reader.pcm.size < want.size
    reader.read()
    assert np.array_equal(reader.wait().pcm, want)


def check_step_phases_are_timed_there_and_handed_over(remote: ProcessPipeline) -> None:
    """The bench's host-clock step timer gets the engine process's steps by kind."""
    timer = StepKindTimer()
    remote.set_phase_timer(timer)
    run(remote, speech("timed", max_new_tokens=6, ignore_eos=True))
    remote.set_phase_timer(NoTimer())
    kinds = timer.summary()["talker"]
    assert kinds["mixed_step"]["count"] >= 1 and kinds["decode_step"]["count"] >= 5
    assert set(kinds) <= {"decode_step", "mixed_step", "audio_wait"}  # host clock: no others
    before = timer.summary()
    run(remote, speech("untimed", max_new_tokens=6, ignore_eos=True))
    assert timer.summary() == before


def check_live_text(remote: ProcessPipeline) -> None:
    sink = Collector()
    remote.submit(
        speech("live", "Hello ", max_new_tokens=30, ignore_eos=True, incremental=True), sink
    )
    remote.extend("live", "there, ", False)
    remote.extend("live", "you.", True)
    end = sink.wait().terminal
    assert end.error is None and end.frames == 30 and end.text_done_at is not None


def streaming(remote: ProcessPipeline, rid: str) -> FirstAudio:
    """A long request, once its first audio has come."""
    sink = FirstAudio()
    remote.submit(speech(rid, max_new_tokens=4000, ignore_eos=True), sink)
    assert sink.started.wait(30)
    return sink


def assert_killed(sink: Collector) -> None:
    """Its one terminal event says the engine process was killed."""
    end = sink.wait(30).terminal
    assert end.finish_reason == "error"
    code = -signal.SIGKILL
    assert end.error == f"the engine process exited (code {code}); the pipeline is down"


def test_a_dead_engine_process_ends_its_requests_and_refuses_new_ones():
    remote = process_pipeline()
    remote.start()
    try:
        sink = streaming(remote, "cut")
        os.kill(remote.pid, signal.SIGKILL)
        assert_killed(sink)
        stats = remote.stats()
        assert not stats.healthy and [s.name for s in stats.stages] == ["talker"]
        with pytest.raises(PipelineUnavailable, match="engine process exited"):
            remote.submit(speech("after"), Collector())
        remote.abort("cut")  # nothing to end: no error
        remote.consumed("cut", 10)
    finally:
        remote.stop()


def test_a_build_failing_in_the_engine_process_is_raised_here(tmp_path):
    graph = build_graph(compose([*FUSED, PROCESS]))
    model = graph.model.model_copy(update={"load": "checkpoint", "path": str(tmp_path)})
    with pytest.raises(ValueError, match=f"{tmp_path}: no config.json"):
        build_pipeline(dataclasses.replace(graph, model=model))


def test_a_voice_encoded_in_the_engine_process_equals_one_encoded_here():
    base = ("model=qwen3_tts_tiny_base", "server.warmup_frames=0")
    local = build("qwen3_tts_fused", *base)
    audio = np.sin(np.arange(24000) / 24000 * 2 * np.pi * 180).astype(np.float32)
    try:
        want = local.reference_encoder().encode(torch.from_numpy(audio))
    finally:
        local.stop()
    remote = process_pipeline(*base)
    try:
        got = remote.reference_encoder().encode(torch.from_numpy(audio))
    finally:
        remote.stop()
    assert got.ref_codes == want.ref_codes and got.speaker_embedding == want.speaker_embedding


def test_served_over_http_the_bytes_are_the_in_process_ones_and_the_engine_reports_itself():
    """The same bytes either way; with the engine in its own process /metrics also gives
    that process's memory and CPU (`omniflow_engine_process_*`), which in-process are the
    server's own `process_*`."""
    body = {
        "model": "qwen3-tts-tiny",
        "input": "Hello there.",
        "voice": "vivian",
        "response_format": "pcm",
        "seed": 5,
        "max_new_tokens": 12,
        "ignore_eos": True,
    }
    got = []
    for runtime in ("in_process", "process"):
        spec = compose([*FUSED, f"pipeline.runtime={runtime}"])
        with ServerThread(build_pipeline(build_graph(spec)), spec.server) as srv:
            r = httpx.post(f"{srv.url}/v1/audio/speech", json=body, timeout=60)
            assert r.status_code == 200, r.text
            got.append(r.content)
            metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
            engine = re.search(r"^omniflow_engine_process_resident_memory_bytes (\S+)$", metrics, M)
            assert (engine is not None) == (runtime == "process")
            if engine is not None:  # a process of its own: tens of MB at least (torch)
                assert float(engine.group(1)) > 50e6
            assert "\nprocess_resident_memory_bytes " in metrics  # the server's, as before
    assert got[0] == got[1] and len(got[0]) == 12 * SPF * 2


def test_events_cross_as_one_array_and_come_back_whole():
    a, b = np.arange(5, dtype=np.float32), np.arange(3, dtype=np.float32) + 10
    events = [
        AudioEvent("x", a, frames=1, seated_at=1.5),
        AudioEvent("y", None, frames=0),
        AudioEvent("x", b, frames=2),
        AudioEvent("x", finished=True, finish_reason="error", error="boom", text_done_frames=4),
    ]
    message = pack(events, [("talker", OBSERVED, 0.01)])
    assert message.pcm.shape == (8,) and message.steps == (("talker", OBSERVED, 0.01),)
    back = unpack(message)
    assert [dataclasses.replace(e, pcm=None) for e in back] == [
        dataclasses.replace(e, pcm=None) for e in events
    ]
    assert np.array_equal(back[0].pcm, a) and back[1].pcm is None
    assert not np.shares_memory(back[0].pcm, message.pcm)  # one held event pins no others
    assert np.array_equal(back[2].pcm, b) and back[3].pcm is None


def test_failures_cross_with_their_type_and_words():
    again = Failure.of(Overloaded("at capacity", retry_after_s=2.5)).error()
    assert isinstance(again, Overloaded) and again.retry_after_s == 2.5
    assert str(again) == "at capacity"
    many = ConfigErrors([ConfigError("a.b", "bad"), ConfigError("c", "worse")])
    again = Failure.of(many).error()
    assert isinstance(again, ConfigErrors) and str(again) == str(many)
    again = Failure.of(ConfigError("model.path", "missing")).error()
    assert type(again) is ConfigError and again.key == "model.path" and again.reason == "missing"
    assert type(Failure.of(PipelineUnavailable("down")).error()) is PipelineUnavailable
    assert type(Failure.of(ValueError("no")).error()) is ValueError
    other = Failure.of(KeyError("k")).error()
    assert isinstance(other, RuntimeError) and "KeyError" in str(other)
    assert Reply(3, failure=Failure.of(ValueError("v"))).failure.kind == "value"


def test_the_orchestrator_refuses_a_prebuilt_model_for_the_process_runtime():
    graph = build_graph(compose([*FUSED, PROCESS]))
    with pytest.raises(ValueError, match="no prebuilt"):
        build_pipeline(graph, prebuilt=object())


def test_a_reply_goes_after_the_events_made_before_it():
    """An abort's reply must reach the server after the request's terminal event (`abort`
    returns once its sink has it), and step times ride with the last events."""
    first, last = AudioEvent("x", np.ones(2, np.float32)), AudioEvent("x", finished=True)
    reply = Reply(7)
    sent = messages([first, reply, last], [("talker", "decode_step", 0.5)])
    assert len(sent) == 3 and sent[1] is reply
    assert [e.request_id for e in unpack(sent[0])] == ["x"] and sent[0].steps == ()
    assert unpack(sent[2])[0].finished and sent[2].steps == (("talker", "decode_step", 0.5),)
    assert messages([reply], []) == [reply]


EXIT_WITHOUT_STOP = """
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from tests.factories import FirstAudio, speech

pipeline = build_pipeline(build_graph(compose(["platform=cpu", "pipeline.runtime=process"])))
pipeline.start()
sink = FirstAudio()
pipeline.submit(speech("left", max_new_tokens=4000 if RUNNING else 8, ignore_eos=True), sink)
assert sink.started.wait(30) if RUNNING else sink.wait(30)  # idle: the reader waits on the pipe
print("engine", pipeline.pid, flush=True)
"""


@pytest.mark.parametrize("running", [True, False])
def test_an_interpreter_leaving_without_stop_takes_its_engine_process_along(running):
    """No `stop()`, a request running or none: the engine process still ends, and so does
    the interpreter (multiprocessing joins its children at exit)."""
    code = f"RUNNING = {running}\n" + EXIT_WITHOUT_STOP
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone (reaped by its parent's exit hook)


def test_bench_refuses_device_phase_timing_in_another_process(capsys):
    from omniflow import cli

    argv = ["bench", *FUSED, PROCESS, "bench.phase_timing=device"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "bench.phase_timing: device synchronises" in err
    assert "pipeline.runtime=process the steps run in another process" in err


class BlockedEncoder:
    """A reference encoder that waits for the test to let it finish."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def encode(self, audio):
        assert self.go.wait(30)
        return ("codes", audio.shape[0])


class FakePipeline:
    def __init__(self) -> None:
        self.encoder = BlockedEncoder()

    def reference_encoder(self):
        return self.encoder

    def stats(self):
        return "gauges"

    def submit(self, speech, sink, limits):
        raise TypeError("a bug in submit")


class Replies:
    def __init__(self) -> None:
        self.got: queue.Queue[Reply] = queue.Queue()

    def reply(self, reply: Reply) -> None:
        self.got.put(reply)

    def event(self, ev) -> None:
        raise AssertionError("no events here")


def test_an_encode_does_not_hold_up_the_calls_behind_it():
    """Encodes run beside the call loop: a stats call behind a running encode answers while
    the encode still runs, and the encode answers when it finishes."""
    fake, replies = FakePipeline(), Replies()
    calls = Calls(fake, replies)  # type: ignore[arg-type]
    try:
        calls.run(Encode(1, np.zeros(5, np.float32)))
        calls.run(Control(2, "stats"))
        first = replies.got.get(timeout=30)
        assert (first.call, first.value) == (2, "gauges") and not fake.encoder.go.is_set()
        fake.encoder.go.set()
        second = replies.got.get(timeout=30)
        assert (second.call, second.value) == (1, ("codes", 5))
    finally:
        fake.encoder.go.set()
        calls.encoders.shutdown()


def test_an_unexpected_error_in_a_call_is_the_callers_not_the_engines():
    """In-process a bug in `submit` is that request's error (a 500); here too: relayed as a
    RuntimeError naming it, the call loop going on."""
    replies = Replies()
    calls = Calls(FakePipeline(), replies)  # type: ignore[arg-type]
    try:
        calls.run(Submit(3, speech("x"), RequestLimits()))
        failure = replies.got.get(timeout=30).failure
        assert failure is not None and failure.kind == "other"
        assert str(failure.error()) == "in the engine process: TypeError: a bug in submit"
        calls.run(Control(4, "stats"))
        assert replies.got.get(timeout=30).value == "gauges"
    finally:
        calls.encoders.shutdown()


def test_an_engine_process_that_answers_nothing_is_taken_down(monkeypatch):
    """A hung engine (stopped here with SIGSTOP) fails the call that waits on it after the
    wait, and is killed: its requests end with one error each, later calls refuse at once."""
    monkeypatch.setattr("omniflow.engine.process_link.CALL_WAIT_S", 1.0)
    remote = process_pipeline()
    remote.start()
    try:
        sink = streaming(remote, "hung")
        os.kill(remote.pid, signal.SIGSTOP)
        with pytest.raises(PipelineUnavailable, match="answered nothing in 1 s"):
            remote.submit(speech("second"), Collector())
        assert_killed(sink)
        assert not remote.stats().healthy
        with pytest.raises(PipelineUnavailable, match="exited"):
            remote.submit(speech("after"), Collector())
    finally:
        remote.stop()


def test_bench_times_the_engine_process_steps_by_kind(tmp_path):
    """`omniflow bench` with the engine in its own process: result.json's `steps` holds the
    served stage's decode and mixed steps, timed there on the host clock."""
    from omniflow import cli

    out = tmp_path / "job"
    small = ["bench.num_prompts=2", "bench.max_frames=4", "bench.rounds=1", "bench.warmup=0"]
    assert cli.main(["bench", *FUSED, PROCESS, *small, f"bench.out_dir={out}"]) == 0
    res = json.loads((out / "result.json").read_text())
    kinds = res["steps"]["talker"]
    assert kinds["mixed_step"]["count"] >= 1 and kinds["decode_step"]["count"] >= 2
    assert "steps" not in res["nulls"]


def test_a_message_audio_crosses_the_pipe_as_bytes_after_it():
    """`send` pickles an `Events` without its PCM and writes the PCM as raw bytes after it;
    `receive` puts them together again. A message without PCM is one message."""
    left, right = multiprocessing.Pipe()
    audio = np.arange(6, dtype=np.float32)
    with_pcm = pack([AudioEvent("x", audio, frames=3), AudioEvent("x", finished=True)])
    without = pack([AudioEvent("y", finished=True)], [("talker", OBSERVED, 0.2)])
    for message in (with_pcm, without, with_pcm):
        send(left, message)
    first, second, third = receive(right), receive(right), receive(right)
    assert not right.poll()  # nothing left over: each message read whole
    assert np.array_equal(unpack(first)[0].pcm, audio) and unpack(first)[1].finished
    assert unpack(second)[0].request_id == "y" and second.steps == (("talker", OBSERVED, 0.2),)
    assert np.array_equal(unpack(third)[0].pcm, audio)


def failing_gauges():
    raise TypeError("a bug in the gauges")


def sender_that_fails(conn) -> None:
    """Child: an outbox whose gauges raise, handed one event; then it waits on the pipe as the
    engine process's call loop does."""
    outbox = Outbox(conn, failing_gauges)
    outbox.event(AudioEvent("x", np.zeros(4, np.float32)))
    conn.recv()


def test_a_failing_sender_ends_the_engine_process():
    """Whatever the engine process's sender raises ends that process (status 70): the server
    sees the pipe's end and ends every request with one error, never a silent engine."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=sender_that_fails, args=(theirs,))
    child.start()
    theirs.close()
    child.join(timeout=60)
    try:
        assert child.exitcode == SENDER_FAILED == 70
        with pytest.raises(EOFError):
            ours.recv()  # nothing was sent, and the pipe has ended
    finally:
        if child.is_alive():
            child.kill()
