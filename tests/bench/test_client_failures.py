"""Failed requests are data: the load generator records them (never retried, never fatal),
checks every stream's length, and the job and the sweep summary report them."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct

import httpx
import pytest

from omniflow.bench.client import BYTES_PER_FRAME, BYTES_PER_SECOND, BadResponse, Prompt, run
from omniflow.bench.job import load_in_child
from omniflow.bench.outcome import Failure, Outcome, Sample, summarize

FRAMES = 3
WANT = FRAMES * BYTES_PER_FRAME  # bytes a FRAMES-frame request must stream (PCM16, 24 kHz)


class FakeSpeech:
    """A bare HTTP/1.1 server (keep-alive, chunked streams) for `/v1/audio/speech` whose
    answer the request's `input` picks: `ok` streams the frames asked for, `503` refuses,
    `short`/`long` stream a frame too few/many and end the stream cleanly, `drop` closes the
    connection before any header, `reset` resets it (the GPU sweep's ReadError)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.seeds: list[int] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                headers = dict(
                    line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line
                )
                length = int({k.lower(): v for k, v in headers.items()}["content-length"])
                body = json.loads(await reader.readexactly(length))
                kind = body["input"]
                self.requests.append(kind)
                self.seeds.append(body["seed"])
                want = body["max_new_tokens"] * BYTES_PER_FRAME
                if kind == "drop":
                    writer.close()
                    return
                if kind == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if kind == "503":
                    msg = b'{"error": {"message": "overloaded"}}'
                    writer.write(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg)
                    )
                else:
                    n = {"short": want - BYTES_PER_FRAME, "long": want + BYTES_PER_FRAME}.get(
                        kind, want
                    )
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for part in (b"\x01" * (n // 2), b"\x01" * (n - n // 2)):
                        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def serving(fake: FakeSpeech, work) -> object:
    """Run `work(url)` (a coroutine function) while `fake` serves on a free loopback port."""
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        return await work(url)


KINDS = ["ok", "503", "ok", "short", "drop", "ok", "long", "reset", "ok"]


def test_failed_requests_are_counted_with_their_errors_and_the_run_completes():
    fake = FakeSpeech()
    prompts = [Prompt(kind, FRAMES) for kind in KINDS]
    outcome = asyncio.run(serving(fake, lambda url: run(url, prompts, 3, 0, "m", "v")))
    assert sorted(fake.requests) == sorted(KINDS)  # each sent once: nothing retried
    errors = {KINDS[f.prompt]: f.error for f in outcome.failures}
    assert set(errors) == {"503", "short", "long", "drop", "reset"}
    assert errors["503"].startswith("HTTP 503: ") and "overloaded" in errors["503"]
    assert errors["short"] == f"short audio: got {WANT - BYTES_PER_FRAME} of {WANT} bytes"
    assert errors["long"] == f"long audio: got {WANT + BYTES_PER_FRAME} of {WANT} bytes"
    assert errors["drop"].startswith("RemoteProtocolError: ")
    assert errors["reset"].startswith("ReadError: ")
    assert all(f.after_s >= 0 for f in outcome.failures)
    # the status when the server answered with one: only the 503 is a refusal
    statuses = {KINDS[f.prompt]: f.status for f in outcome.failures}
    assert statuses == {"503": 503, "short": None, "long": None, "drop": None, "reset": None}
    assert [KINDS[f.prompt] for f in outcome.failures if f.refused] == ["503"]

    s = summarize(outcome)
    assert (s["requests"], s["completed"], s["failed"], s["refused"]) == (9, 4, 5, 1)
    assert sorted(e["error"] for e in s["errors"]) == sorted(errors.values())
    assert all(e["count"] == 1 for e in s["errors"])
    audio = 4 * WANT / BYTES_PER_SECOND  # the short/long streams' bytes do not count
    assert s["audio_seconds"] == pytest.approx(audio)
    assert s["audio_throughput"] == pytest.approx(audio / outcome.wall_s)
    assert s["rtf"]["max"] == max(x.rtf for x in outcome.samples)


def test_each_lane_keeps_one_connection_and_every_prompt_is_sent_once():
    """`concurrency` lanes, each with its own one-connection client kept alive across its
    requests, taking prompts from one shared queue (docs/performance.md: a pool shared by 128
    requests cost the load generator a whole core)."""
    fake = FakeSpeech()
    prompts = [Prompt("ok", FRAMES)] * 12
    outcome = asyncio.run(serving(fake, lambda url: run(url, prompts, 4, 1, "m", "v")))
    assert len(outcome.samples) == 12 and outcome.failures == []
    assert sorted(fake.seeds) == [0, *range(1000, 1012)]  # the warm-up, then each prompt once
    assert fake.connections == 1 + 4  # the warm-up's client, then one per lane
    # each request's send time kept, so the round has a steady state (bench/steady.py)
    assert outcome.lanes == 4
    sends = sorted(s.sent_s for s in outcome.samples)
    assert sends[0] >= 0 and sends[-1] <= outcome.wall_s and sends[:4] != sends[-4:]
    assert summarize(outcome)["steady"]["span_s"] == pytest.approx(sends[-1] - sends[4])


@pytest.mark.parametrize("kind", ["503", "short", "drop"])
def test_a_failing_warmup_still_fails_the_run(kind):
    """A server that cannot serve the warm-up is broken: no numbers, an error."""
    prompts = [Prompt(kind, FRAMES), Prompt("ok", FRAMES)]
    with pytest.raises((BadResponse, httpx.TransportError)):
        asyncio.run(serving(FakeSpeech(), lambda url: run(url, prompts, 1, 1, "m", "v")))


def test_summary_when_every_request_failed_has_counts_and_no_stats():
    failures = [Failure(i, f"HTTP 503: {i % 7}", 0.1) for i in range(20)]
    s = summarize(Outcome([], failures, 2.0))
    assert (s["requests"], s["completed"], s["failed"]) == (20, 0, 20)
    assert s["rtf"] is None and s["ttfp_s"] is None and s["audio_throughput"] == 0
    # 7 distinct texts: the 5 most frequent, the other 2 together; counts add up
    assert len(s["errors"]) == 6 and s["errors"][-1]["error"] == "(2 other errors)"
    assert sum(e["count"] for e in s["errors"]) == 20


def test_the_child_process_hands_its_failures_to_the_job(tmp_path):
    """`load_in_child` (the job's path): the child's --out file carries the failures."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"text": k, "seconds": 1.0} for k in ("ok", "503", "short")]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))

    async def work(url: str) -> Outcome:
        args = [f"--url={url}", f"--prompts={prompts}", "--num-prompts=3", "--max-frames=2"]
        return await asyncio.to_thread(load_in_child, [*args, "--warmup=0"])

    outcome = asyncio.run(serving(FakeSpeech(), work))
    assert [f.error.split(":")[0] for f in outcome.failures] == ["HTTP 503", "short audio"]
    assert [f.prompt for f in outcome.failures] == [1, 2]
    assert [f.refused for f in outcome.failures] == [True, False]  # the status crosses too
    assert len(outcome.samples) == 1 and isinstance(outcome.samples[0], Sample)


def _table(summary_md: str) -> list[dict[str, str]]:
    lines = [ln for ln in summary_md.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


def test_job_result_and_sweep_summary_show_the_failures(tmp_path, monkeypatch, caplog):
    """run_job with the load generator's outcome given: result.json carries the failures per
    round and in total, a warning names them, and summary.md has the failed column."""
    from omniflow.bench import job
    from omniflow.bench.sweep import summarize as summarize_sweep
    from omniflow.config.compose import compose

    ok = Sample(ttfp=0.1, e2el=0.5, audio_s=1.0, underrun_s=0.0)
    outcomes = iter(
        [
            Outcome([ok, ok], [Failure(2, "ReadError: reset", 0.3)], 1.0),
            Outcome([ok], [Failure(i, "HTTP 503: busy", 0.1, status=503) for i in (0, 1)], 2.0),
        ]
    )
    monkeypatch.setattr(job, "load_in_child", lambda args, bar=None: next(outcomes))
    spec = compose(["platform=cpu", "bench.num_prompts=3", "bench.rounds=2", "bench.warmup=0"])
    with caplog.at_level(logging.WARNING, logger="omniflow.bench.job"):
        job.run_job(spec, ["bench.rounds=2"], tmp_path / "0")
    result = json.loads((tmp_path / "0" / "result.json").read_text())
    assert [r["failed"] for r in result["rounds"]] == [1, 2]
    assert [r["refused"] for r in result["rounds"]] == [0, 2]
    assert result["summary"]["refused"] == 2
    assert [r["completed"] for r in result["rounds"]] == [2, 1]
    assert result["summary"]["failed"] == 3 and result["summary"]["completed"] == 3
    assert result["first_audio_parts"] is None  # no request reached this job's server
    assert result["summary"]["errors"] == [
        {"error": "HTTP 503: busy", "count": 2},
        {"error": "ReadError: reset", "count": 1},
    ]
    assert result["rounds"][1]["audio_throughput"] == pytest.approx(0.5)  # 1 s of audio / 2 s
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "omniflow.bench.job" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 3
    assert "round 1/2: 1 of 3 requests failed" in warnings[0] and "ReadError: reset" in warnings[0]
    assert "round 2/2: 2 of 3 requests refused by the server" in warnings[1]
    # once a job: where the refusals came from and the key that queues them instead
    assert "503" in warnings[2] and "server.max_first_audio_wait_s=0.5 s" in warnings[2]
    assert "=null queues them" in warnings[2] and "429" not in warnings[2]

    old = json.loads(json.dumps(result))  # a result from before failures were recorded
    old["overrides"] = ["bench.rounds=1"]
    for r in old["rounds"]:
        del r["failed"]
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "result.json").write_text(json.dumps(old))
    rows = _table(summarize_sweep(tmp_path))
    assert [row["failed"] for row in rows] == ["3", "0"]
    assert rows[0]["RTF median (min-max)"] == "0.500 (0.500-0.500)"


def test_the_refusal_hint_names_the_key_behind_each_status():
    from omniflow.bench.job import refusal_hint
    from omniflow.config.server import ServerConfig

    cap = refusal_hint({429}, ServerConfig(max_concurrent_requests=8))
    assert "server.max_concurrent_requests=8" in cap and "max_first_audio_wait_s" not in cap
    # no admission limit: a 503 is a shutdown or a dead stage, and null is no advice
    down = refusal_hint({503}, ServerConfig(max_first_audio_wait_s=None))
    assert "shutting down or a stage down" in down and "=null" not in down
    both = refusal_hint({429, 503}, ServerConfig())
    assert "=null queues them" in both and "server.max_concurrent_requests" in both


def test_a_job_where_no_request_completed_fails_after_writing_its_result(tmp_path, monkeypatch):
    from omniflow.bench import job
    from omniflow.bench.sweep import summarize as summarize_sweep
    from omniflow.config.compose import compose

    monkeypatch.setattr(
        job,
        "load_in_child",
        lambda args, bar=None: Outcome([], [Failure(0, "HTTP 503: busy", 0.1)], 1.0),
    )
    spec = compose(["platform=cpu", "bench.num_prompts=1", "bench.rounds=1", "bench.warmup=0"])
    with pytest.raises(RuntimeError, match=r"no request completed: all 1 failed .*HTTP 503"):
        job.run_job(spec, [], tmp_path / "0")
    result = json.loads((tmp_path / "0" / "result.json").read_text())
    assert result["summary"]["failed"] == 1 and result["summary"]["rtf"] is None
    [row] = _table(summarize_sweep(tmp_path))
    assert row["failed"] == "1" and row["RTF median (min-max)"] == "-"


@pytest.mark.parametrize(
    ("extra", "want"),
    [([], 3), (["bench.prompts_per_lane=5"], 10), (["bench.prompts_per_lane=1"], 3)],
)
def test_prompts_per_lane_raises_the_round_to_that_many_per_request_in_flight(
    tmp_path, monkeypatch, extra, want
):
    from omniflow.bench import job
    from omniflow.config.compose import compose

    sent: list[list[str]] = []

    def child(args: list[str], bar: object = None) -> Outcome:
        sent.append(args)
        return Outcome([], [Failure(0, "HTTP 503: busy", 0.1)], 1.0)

    monkeypatch.setattr(job, "load_in_child", child)
    over = ["platform=cpu", "bench.num_prompts=3", "bench.concurrency=2", "bench.rounds=1"]
    spec = compose([*over, "bench.warmup=0", *extra])
    with pytest.raises(RuntimeError, match="no request completed"):
        job.run_job(spec, over, tmp_path / "0")
    assert f"--num-prompts={want}" in sent[0] and "--concurrency=2" in sent[0]
    result = json.loads((tmp_path / "0" / "result.json").read_text())
    assert result["config"]["num_prompts"] == want
    assert len(result["config"]["frames_per_prompt"]) == want


def test_a_sweep_whose_jobs_sent_different_counts_shows_them_per_job(tmp_path, monkeypatch):
    from omniflow.bench import job
    from omniflow.bench.sweep import summarize as summarize_sweep
    from omniflow.config.compose import compose

    monkeypatch.setattr(
        job,
        "load_in_child",
        lambda args, bar=None: Outcome([], [Failure(0, "HTTP 503: busy", 0.1)], 1.0),
    )
    for i, c in enumerate((1, 4)):
        over = ["platform=cpu", f"bench.concurrency={c}", "bench.prompts_per_lane=2"]
        with pytest.raises(RuntimeError, match="no request completed"):
            job.run_job(
                compose([*over, "bench.num_prompts=1", "bench.warmup=0"]), over, tmp_path / str(i)
            )
    text = summarize_sweep(tmp_path)
    assert [(row["bench.concurrency"], row["prompts"]) for row in _table(text)] == [
        ("1", "2"),
        ("4", "8"),
    ]
    assert "prompts per round in the table" in text


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["bench.num_prompts=4"], "bench.num_prompts"),
        (["bench.prompts_per_lane=3"], "bench.prompts_per_lane"),
    ],
)
def test_a_prompt_file_too_short_for_the_round_is_refused_naming_the_key(tmp_path, extra, key):
    from omniflow.bench import job
    from omniflow.config.compose import compose
    from omniflow.errors import ConfigError

    prompts = tmp_path / "three.jsonl"
    prompts.write_text(
        "".join(json.dumps({"text": f"t{i}", "seconds": 1.0}) + "\n" for i in range(3))
    )
    over = [
        "platform=cpu",
        f"bench.prompts={prompts}",
        "bench.num_prompts=2",
        "bench.concurrency=2",
    ]
    with pytest.raises(ConfigError) as exc:
        job.run_job(compose([*over, *extra]), over, None)
    assert exc.value.key == key and "holds 3" in str(exc.value)


def test_the_summary_keeps_each_first_audio_in_prompt_order():
    """`ttfp_ms_each`: one value per completed request, in the order of their prompts (a
    failed request leaves no value), in milliseconds."""
    samples = [Sample(ttfp=t, e2el=1.0, audio_s=1.0, underrun_s=0.0) for t in (0.02, 0.01, 0.03)]
    s = summarize(Outcome(samples, [Failure(3, "HTTP 503: busy", 0.1)], 2.0))
    assert s["ttfp_ms_each"] == [20.0, 10.0, 30.0]
