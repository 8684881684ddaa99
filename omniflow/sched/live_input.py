"""A request whose input is still arriving (`core/live.py`), as the scheduler treats it:
text-starved streams have no playback deadline, and more text restarts a starved one's
clock (docs/architecture.md, live input)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from omniflow.core.request import FinishReason, Request
from omniflow.sched.playback import PlaybackClock


def playing(running: Iterable[Request]) -> list[tuple[str, int]]:
    """(request, frames made) of the streams with a playback deadline: a text-starved one
    (its input has not arrived) has none until it does."""
    return [(r.request_id, len(r.output_tokens)) for r in list(running) if r.input_room != 0]


def extend_live(
    req: Request, text: str, done: bool, playback: PlaybackClock | None
) -> tuple[FinishReason, str | None] | None:
    """Give a live request more text (`core/live.py`); a text-starved stream's playback
    clock starts again, as it was waiting for text, not late. How it must end now (an
    error: text it cannot take; `length`: its cap, reached before its text ended), or None."""
    if req.live is None:
        why = f"request {req.request_id!r} takes no more input: it was not started incremental"
        return "error", why
    starved = req.input_room == 0
    try:
        req.live.extend(text, done)
    except ValueError as exc:
        return "error", str(exc)
    if starved and playback is not None:
        playback.resume(req.request_id, req.num_generated)  # with a frame still in flight
    cap = req.live.length_cap()
    if cap is not None:  # never below what it has made: it may end right here
        most = max(req.num_generated, min(req.sampling.max_new_tokens, cap))
        req.sampling = replace(req.sampling, max_new_tokens=most)
    if req.num_generated >= req.sampling.max_new_tokens and not req.num_placeholders:
        return "length", None  # (an in-flight sample's update ends it at its cap instead)
    return None
