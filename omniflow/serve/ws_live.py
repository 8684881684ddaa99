"""Incremental mode of a WebSocket speech session (`"incremental": true` in session.config,
docs/websocket.md): an utterance is one speech request that starts with its first whole
words and takes the rest of its text while it speaks (`Pipeline.extend`), instead of one
request per sentence. Its events keep the sentence mode's shape: one `audio.start`
(sentence_index 0, sentence_text the text received when it started), the audio, one
`audio.done`, then `session.done` at the utterance's end."""

from __future__ import annotations

from dataclasses import dataclass

from omniflow.core.live import settled_text
from omniflow.core.pipeline import Pipeline
from omniflow.serve.text import has_visible


@dataclass
class LiveUtterance:
    """One utterance's text on its way to its request. Before the speaker submits it the
    text gathers in `pending`; after, every piece goes straight to the running request.
    The reader and the speaker share it on the event loop (no await between reading
    `pending` and submitting), so no piece is lost or sent twice."""

    pending: str = ""
    rid: str | None = None
    """The running request (None: not submitted yet)."""
    done: bool = False
    """input.done arrived."""
    queued: bool = False
    """Handed to the speaker (once its first word was whole, or at input.done)."""

    def take(self, text: str, pipeline: Pipeline) -> bool:
        """A piece of text; True when the utterance should now be queued to speak."""
        if self.rid is not None:
            pipeline.extend(self.rid, text, False)
            return False
        self.pending += text
        return not self.queued and has_visible(settled_text(self.pending))

    def end(self, pipeline: Pipeline) -> bool:
        """input.done; True when the utterance should now be queued (it never started)."""
        self.done = True
        if self.rid is not None:
            pipeline.extend(self.rid, "", True)
            return False
        return not self.queued and has_visible(self.pending)  # else nothing to say: skipped

    def started(self, rid: str, pipeline: Pipeline) -> None:
        """The speaker submitted `pending`: later text goes to the request; an utterance
        already ended is told so at once."""
        self.rid, self.pending = rid, ""
        if self.done:
            pipeline.extend(rid, "", True)
