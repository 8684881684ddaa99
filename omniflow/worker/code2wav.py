"""The code2wav runner: decodes each scheduled chunk by continuing the request's streaming
decoder slot (frame-exact, no left-context recomputation). A voice-clone request's slot is
primed with its reference frames when it is taken (`ReferencePriming`), as the fused
talker's is."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from omniflow.core.arrivals import Arrivals
from omniflow.core.audio import PendingAudio
from omniflow.core.pipeline import NoTimer, PhaseTimer
from omniflow.core.step import RequestStepOutput, StepPlan, StepResult
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder, nonfinite, overflow_error
from omniflow.models.qwen3_tts.priming import ReferencePriming
from omniflow.sched.generation import Chunk

log = logging.getLogger(__name__)


class Code2WavRunner:
    """Owns the decoder slots of the requests it is decoding."""

    def __init__(self, decoder: StreamingDecoder, priming: ReferencePriming | None = None) -> None:
        self.decoder = decoder
        self.priming = priming
        self.slots: dict[str, int] = {}
        self.timer: PhaseTimer = NoTimer()
        self.stage_name = "decoder"

    def watch_arrivals(self, arrivals: Arrivals) -> None:
        """Nothing to cut short: a code2wav step is one chunk per request."""

    def set_timer(self, timer: PhaseTimer, stage: str) -> None:
        """Time this runner's decode under the stage's name (benchmarks)."""
        self.timer, self.stage_name = timer, stage

    def decoder_slots(self) -> tuple[int, int] | None:
        """(in use, total) decoder slots."""
        return (self.decoder.num_in_use, self.decoder.num_slots)

    def send_chunks(self, sink: Callable[[PendingAudio], None]) -> None:
        """Nothing to send early: this stage makes no windows."""

    def take_audio(self, step_id: int) -> None:
        """Nothing pending: this stage's audio is its output (`RequestStepOutput.audio`)."""
        return None

    def prefills(self) -> None:
        """A generation stage runs no prefill."""
        return None

    def _release(self, rid: str) -> None:
        if self.priming is not None:
            self.priming.discard(rid)
        slot = self.slots.pop(rid, None)
        if slot is not None:
            self.decoder.release(slot)

    def execute(self, plan: StepPlan) -> StepResult:
        for rid in plan.finished_ids:
            self._release(rid)
        if plan.is_empty:
            return StepResult(plan.step_id, {})
        rids = list(plan.num_scheduled_tokens)
        chunks: list[Chunk] = [plan.chunks[r] for r in rids]
        try:
            slots = []
            primed: list[int] = []
            refs: list[torch.Tensor] = []
            for rid in rids:
                if rid not in self.slots:
                    self.slots[rid] = self.decoder.allocate()
                    ref = self.priming.take(rid) if self.priming is not None else None
                    if ref is not None:
                        primed.append(self.slots[rid])
                        refs.append(ref)
                slots.append(self.slots[rid])
            codes = [
                torch.tensor(c.frames, dtype=torch.int64).reshape(len(c.frames), -1)
                if c.frames
                else torch.zeros(0, 16, dtype=torch.int64)
                for c in chunks
            ]
            with self.timer.phase(self.stage_name, "audio"):
                if primed:  # PCM discarded: only the state matters
                    self.decoder.prime(primed, refs)
                pcm = self.decoder.decode(slots, codes)
        except (RuntimeError, ValueError) as exc:  # a decoder failure ends each request once
            log.exception("code2wav step %d failed", plan.step_id)
            for rid in rids:
                self._release(rid)
            return StepResult(
                plan.step_id, {r: RequestStepOutput(error=f"code2wav: {exc}") for r in rids}
            )
        outputs = {}
        for rid, chunk, audio in zip(rids, chunks, pcm, strict=True):
            samples = audio.float().cpu().numpy()
            bad = nonfinite(self.decoder.dtype, [rid], samples)
            error = overflow_error(self.decoder.dtype) if bad else None
            outputs[rid] = RequestStepOutput(audio=samples if error is None else None, error=error)
            if chunk.last or error is not None:
                self._release(rid)
        return StepResult(plan.step_id, outputs)
