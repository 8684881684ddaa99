"""input.cancel arriving while the speaker sends an utterance's own session.done (its end
taken off the queue, the send not yet drained): the utterance has ended by then, so the
cancel finds nothing under way and the client gets one session.done, not a second one
marked cancelled (serve/ws_speaker.py `speak_all`, serve/ws_session.py `cancel`); and the
speaker stopped just as that send completes does stop. The socket is a fake whose send of
that session.done waits, so the cancel lands there."""

from __future__ import annotations

import asyncio

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.serve.run import make_app
from omniflow.serve.ws_events import audio_done
from omniflow.serve.ws_session import Session


class HeldSocket:
    """Records what is sent; the send of an utterance's session.done waits for `drained`."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.drained = asyncio.Event()
        self.sending_done = asyncio.Event()

    async def send_json(self, data: dict) -> None:
        self.sent.append(data)  # the frame is on the wire...
        if data["type"] == "session.done" and not data.get("cancelled"):
            self.sending_done.set()
            await self.drained.wait()  # ...and the send waits for the socket to drain

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append({"type": "bytes", "size": len(data)})


async def spoken_at_once(self, index: int, text: str, live=None) -> None:
    """A sentence spoken without the pipeline: its audio.start and audio.done."""
    self.current = [index, 0]
    await self.send_event({"type": "audio.start", "sentence_index": index})
    self.current, self.index = None, index + 1
    await self.send_event(audio_done(self.utterance, index, 0, None))


def test_a_cancel_while_the_session_done_is_sent_ends_nothing(monkeypatch):
    spec = compose(["platform=cpu"])
    pipeline = build_pipeline(build_graph(spec))
    try:
        app = make_app(pipeline, spec.server)
        monkeypatch.setattr(Session, "speak", spoken_at_once)

        async def run() -> list[dict]:
            ws = HeldSocket()
            session = Session(app.state.speech_sessions, ws)
            session.template = object()  # configured (the fake speaker reads nothing of it)
            session.start_speaker()
            session.take_text({"text": "Hello there."})
            session.end_utterance()
            await asyncio.wait_for(ws.sending_done.wait(), 10)
            await session.cancel()  # lands while the session.done is being sent
            ws.drained.set()
            # stopped as its send completes: the cancel is not swallowed (the speaker's send
            # uses asyncio.timeout; wait_for could eat it and leave this waiting forever)
            stopping = asyncio.ensure_future(session.stop_speaker())
            done, _ = await asyncio.wait([stopping], timeout=10)
            assert done, "the speaker did not stop"
            return ws.sent

        sent = asyncio.run(run())
    finally:
        pipeline.stop()
    ends = [m for m in sent if m["type"] == "session.done"]
    assert ends == [{"type": "session.done", "utterance_index": 0, "total_sentences": 1}], sent
