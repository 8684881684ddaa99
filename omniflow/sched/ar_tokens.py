"""How an AR request takes the tokens a step sampled for it, and which token ends it."""

from __future__ import annotations

import logging
import time

from omniflow.core.output import StageOutput
from omniflow.core.request import Request, RequestState
from omniflow.core.step import RequestStepOutput

log = logging.getLogger(__name__)


def take_tokens(
    req: Request, out: RequestStepOutput, max_model_len: int, limit_key: str
) -> tuple[StageOutput, RequestState | None]:
    """Append the step's tokens and frames to the request, up to the first that ends it (a
    window may have sampled past it); the stage output, and the finished state if one did."""
    tokens: list[int] = []
    frames: list[object] = []
    state: RequestState | None = None
    first = not req.output_tokens
    for tok, frame in zip(out.tokens, out.frames, strict=True):
        req.output_tokens.append(tok)
        req.output_frames.append(frame)
        tokens.append(tok)
        frames.append(frame)
        state = stop_state(req, tok, max_model_len, limit_key)
        if state is not None:
            break
    taken = text_taken(req)
    output = StageOutput(
        req.request_id,
        tokens=tuple(tokens),
        frames=tuple(frames),
        finished=state is not None,
        finish_reason=state.reason if state is not None else None,
        seated_at=req.seated_at if first and tokens else None,
        text_done_at=taken[0] if taken else None,
        text_done_after=taken[1] if taken else 0,
    )
    return output, state


def text_taken(req: Request) -> tuple[float, int] | None:
    """When a live request's end of text is first seen taken (stamped on the request), and
    how many of its tokens came after the one the taking step sampled (a window's later
    steps), on the output that brings it; None on every other output. Decode step s samples
    output token s + 1, so the step that takes the end of the text has come back once there
    are `end_step() + 2` output tokens."""
    if req.live is None or req.text_done_at is not None:
        return None
    end = req.live.end_step()
    if end is None or len(req.output_tokens) < end + 2:
        return None
    req.text_done_at = time.perf_counter()
    return req.text_done_at, len(req.output_tokens) - (end + 2)


def stop_state(req: Request, token: int, max_model_len: int, limit_key: str) -> RequestState | None:
    """The finished state `token` (just appended) puts the request in; None: it goes on.
    `limit_key`: the key that sets max_model_len, named when it cuts a request short."""
    s = req.sampling
    if token in s.stop_token_ids and not s.ignore_eos and len(req.output_tokens) > s.min_new_tokens:
        return RequestState.FINISHED_STOPPED
    if len(req.output_tokens) >= s.max_new_tokens:
        return RequestState.FINISHED_LENGTH
    if req.prompt_len + len(req.output_tokens) >= max_model_len:
        # The client cannot tell (a 200 stream ends as after max_new_tokens): the log says.
        log.warning(
            "request %s reached max_model_len %d (a prompt of %d tokens and %d frames) before "
            "its end: its audio is cut short; raise %s or send shorter text",
            req.request_id,
            max_model_len,
            req.prompt_len,
            len(req.output_tokens),
            limit_key,
        )
        return RequestState.FINISHED_LENGTH
    return None


def tokens_to_schedule(req: Request, budget: int, max_model_len: int) -> int:
    """Tokens of `req` to compute now, clipped to the budget. A step that reaches the end of
    its known tokens samples one, so it is planned only while the request may grow: async
    scheduling never runs past max_new_tokens."""
    remaining = req.num_tokens - req.num_computed_tokens
    if remaining <= 0:
        return 0
    n = min(remaining, budget)
    if req.num_computed_tokens + n == req.num_tokens and not may_grow(req, max_model_len):
        return 0
    return n


def may_grow(req: Request, max_model_len: int) -> bool:
    """Below its limits, and not text-starved (its next step's text has arrived)."""
    return (
        req.num_generated < req.sampling.max_new_tokens
        and req.num_tokens < max_model_len
        and req.input_room != 0
    )
