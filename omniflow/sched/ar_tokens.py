"""How an AR request takes the tokens a step sampled for it, and which token ends it."""

from __future__ import annotations

from omniflow.core.output import StageOutput
from omniflow.core.request import Request, RequestState
from omniflow.core.step import RequestStepOutput


def take_tokens(
    req: Request, out: RequestStepOutput, max_model_len: int
) -> tuple[StageOutput, RequestState | None]:
    """Append the step's tokens and frames to the request, up to the first that ends it (a
    window may have sampled past it); the stage output, and the finished state if one did."""
    tokens: list[int] = []
    frames: list[object] = []
    state: RequestState | None = None
    for tok, frame in zip(out.tokens, out.frames, strict=True):
        req.output_tokens.append(tok)
        req.output_frames.append(frame)
        tokens.append(tok)
        frames.append(frame)
        state = stop_state(req, tok, max_model_len)
        if state is not None:
            break
    output = StageOutput(
        req.request_id,
        tokens=tuple(tokens),
        frames=tuple(frames),
        finished=state is not None,
        finish_reason=state.reason if state is not None else None,
    )
    return output, state


def stop_state(req: Request, token: int, max_model_len: int) -> RequestState | None:
    """The finished state `token` (just appended) puts the request in; None: it goes on."""
    s = req.sampling
    if token in s.stop_token_ids and not s.ignore_eos and len(req.output_tokens) > s.min_new_tokens:
        return RequestState.FINISHED_STOPPED
    if len(req.output_tokens) >= s.max_new_tokens:
        return RequestState.FINISHED_LENGTH
    if req.prompt_len + len(req.output_tokens) >= max_model_len:
        return RequestState.FINISHED_LENGTH
    return None
