"""One request run through the pipeline before the server accepts connections.

Why: on a fresh CUDA server the first request paid for what is set up at first use while
`/health` already said ready, and the requests behind it queued (docs/performance.md, "Cold
start"). The warm-up pays it before `ready`. It goes straight to the pipeline, so the HTTP
metrics never count it; the engine's own counters (steps, windows) do.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

from omniflow.config.graph import StageGraph
from omniflow.config.server import ServerConfig
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import Pipeline, PipelineInfo
from omniflow.core.speech import SpeechRequest

log = logging.getLogger("omniflow.serve")

CUDA_FRAMES = 16
"""`warmup_frames: null` on CUDA: two 8-step windows' worth, so windows may run too."""
TIMEOUT_S = 120.0
"""A warm-up still running this long is stuck: the start fails rather than wait forever."""
TEXT = "Warming up before the first request."
DESIGNED_VOICE = "A calm, clear voice."


class WarmupError(RuntimeError):
    """The warm-up request failed: the pipeline cannot serve, so the server does not start."""


def warmup_frames(server: ServerConfig, graph: StageGraph) -> int:
    """`server.warmup_frames` resolved: null is 16 on CUDA, 0 elsewhere and on a Base model
    (every request of one needs a reference); a number is taken as set (a Base model's is
    refused by the config rules)."""
    if server.warmup_frames is not None:
        return server.warmup_frames
    if graph.platform.name != "cuda" or graph.model.task_type == "Base":
        return 0
    return CUDA_FRAMES


def warmup_request(info: PipelineInfo, frames: int) -> SpeechRequest:
    """A request of up to `frames` frames (the model's length limit may end it sooner) that
    any CustomVoice or VoiceDesign model serves; a Base model's needs a reference."""
    if "CustomVoice" not in info.task_types and "VoiceDesign" not in info.task_types:
        raise WarmupError(f"model {info.model!r} serves {info.task_types}: no warm-up request")
    designed = "CustomVoice" not in info.task_types
    return SpeechRequest.create(
        TEXT,
        id_prefix="warmup",
        voice=None if designed else info.voices[0],
        instructions=DESIGNED_VOICE if designed else None,
        seed=0,
        max_new_tokens=frames,
        ignore_eos=True,
    )


@dataclass(frozen=True)
class Warmup:
    """What the warm-up took (logged)."""

    frames: int
    """Frames made (up to those asked)."""
    first_audio_s: float | None
    total_s: float


def run_warmup(pipeline: Pipeline, frames: int, timeout_s: float = TIMEOUT_S) -> Warmup:
    """Run one request of up to `frames` frames on the started `pipeline` to its end; a
    failure, or no end within `timeout_s` (then the request is aborted), is a WarmupError."""
    events: queue.Queue[AudioEvent] = queue.Queue()
    request = warmup_request(pipeline.info(), frames)
    start = time.perf_counter()
    pipeline.submit(request, events.put)
    first: float | None = None
    made = 0
    while True:
        left = timeout_s - (time.perf_counter() - start)
        try:
            event = events.get(timeout=max(left, 0.0))
        except queue.Empty:
            pipeline.abort(request.request_id, "the warm-up took too long")
            raise WarmupError(f"the warm-up request did not end within {timeout_s:g} s") from None
        if first is None and event.pcm is not None and event.pcm.size:
            first = time.perf_counter() - start
        made = max(made, event.frames)
        if event.finished:
            break
    if event.error is not None:
        raise WarmupError(f"the warm-up request failed: {event.error}")
    done = Warmup(made, first, time.perf_counter() - start)
    log.info(
        "warm-up request: %d frames, first audio %s, done in %.2f s",
        done.frames,
        "none" if first is None else f"{first * 1000:.1f} ms",
        done.total_s,
    )
    return done
