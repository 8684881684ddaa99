"""Requests start in turns of the event loop, on new and kept-alive connections alike
(issue 36 item 16; `serve.intake.Intake`): at most `TURN_REQUESTS` requests with a body per
turn, the rest in arrival order in later turns, and GET/HEAD (health checks) at once.

Before, only a connection's first request was paced: the next requests of a client pool's
kept-alive connections all started in the turn they arrived in, however many, so a
kept-alive `/health` probe waited behind all of them."""

from __future__ import annotations

import asyncio
import collections

from starlette.types import ASGIApp, Receive, Scope, Send

from omniflow.config.compose import compose
from omniflow.serve.intake import TURN_REQUESTS, Intake
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline
from tests.serve.test_keep_alive import idle_connection

POST = b"POST /v1/audio/speech HTTP/1.1\r\n"


class Connection:
    def __init__(self, log: list[tuple[str, int, bytes]], n: int) -> None:
        self.log, self.n = log, n

    def hold(self) -> None:
        self.log.append(("hold", self.n, b""))

    def start(self, data: bytes) -> None:
        self.log.append(("start", self.n, data))


def test_a_turn_starts_at_most_its_share_the_rest_wait_in_order_and_gets_go_at_once():
    async def scenario() -> tuple[list[bool], bool, list[tuple[str, int, bytes]], int]:
        log: list[tuple[str, int, bytes]] = []
        intake = Intake(TURN_REQUESTS)
        conns = [Connection(log, n) for n in range(2 * TURN_REQUESTS + 3)]
        now = [intake.admit(c, POST + b"%d" % c.n) for c in conns]
        assert not intake.admit(conns[-1], b" more")  # bytes read before it was held
        probe = intake.admit(Connection(log, -1), b"GET /health HTTP/1.1\r\n")
        intake.forget(conns[TURN_REQUESTS])  # it closed while waiting
        starts = []
        while intake.waiting:
            await asyncio.sleep(0)  # one turn of the loop
            starts.append(sum(1 for what, *_ in log if what == "start"))
        return now, probe, log, max(b - a for a, b in zip([0, *starts], starts, strict=False))

    now, probe, log, most_per_turn = asyncio.run(scenario())
    assert now == [True] * TURN_REQUESTS + [False] * (TURN_REQUESTS + 3)
    assert probe  # a GET does not wait
    started = [(n, data) for what, n, data in log if what == "start"]
    expected = [n for n in range(TURN_REQUESTS + 1, 2 * TURN_REQUESTS + 3)]
    assert [n for n, _ in started] == expected  # in arrival order, the closed one dropped
    assert started[-1][1] == POST + b"%d more" % (2 * TURN_REQUESTS + 2)
    assert most_per_turn <= TURN_REQUESTS


class StartsPerTurn:
    """Counts POST requests reaching the app per pass of the event loop. From the first
    one on, the serving loop's `_run_once` (one pass: poll, then run what is ready) counts
    its passes. A request task made in one pass reaches the app in its first step, in the
    next pass, with every other task made in that pass."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.turn = 0
        self.starts: collections.Counter[int] = collections.Counter()

    def _count_passes(self, loop: asyncio.AbstractEventLoop) -> None:
        one_pass = loop._run_once  # type: ignore[attr-defined]

        def counted() -> None:
            self.turn += 1
            one_pass()

        loop._run_once = counted  # type: ignore[attr-defined]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            if not self.starts:
                self._count_passes(asyncio.get_running_loop())
            self.starts[self.turn] += 1
        await self.app(scope, receive, send)


def test_a_burst_on_kept_alive_connections_starts_in_turns():
    """64 kept-alive connections (each has made a request) write a speech request at once."""
    server = ServerThread(FakePipeline(), compose(["platform=cpu"]).server)
    counter: list[StartsPerTurn] = []

    def middleware(app: ASGIApp) -> StartsPerTurn:
        counter.append(StartsPerTurn(app))
        return counter[0]

    server.app.add_middleware(middleware)  # type: ignore[arg-type]
    body = b'{"model": "qwen3-tts-tiny", "input": "Hi.", "max_new_tokens": 1}'
    request = (
        POST + b"Host: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with server:
        socks = [idle_connection(server.url) for _ in range(64)]  # kept alive, idle
        for sock in socks:
            sock.sendall(request)
        answers = [sock.recv(65536)[:12] for sock in socks]
        for sock in socks:
            sock.close()
    ticks = counter[0]
    assert answers == [b"HTTP/1.1 200"] * 64
    assert sum(ticks.starts.values()) == 64
    assert max(ticks.starts.values()) <= TURN_REQUESTS, ticks.starts
