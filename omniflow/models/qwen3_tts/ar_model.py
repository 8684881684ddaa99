"""The Qwen3-TTS talker as an `ARModel` (`models/interface.py`) for the generic AR runner.

What is Qwen3-TTS-specific and lives here rather than in the runner: the prompt layout
(`inputs.py`), the EOS frame `(eos, 0, ..., 0)` that a stop token feeds forward, the
suppressed codec ids, the code predictor's ("subtalker") sampling policy, and the streaming
codec decoder's per-request slots (`stream_slots.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from omniflow.device.readback import Readback
from omniflow.models.interface import (
    DecodeInputs,
    Frame,
    FrameSample,
    KVCacheSpec,
    KVLayout,
    PositionSpan,
    PrefillInputs,
    QueuedFrames,
    RowSampler,
    SampledStep,
    TokenPolicy,
)
from omniflow.models.layers.attention import AttentionMetadata, DecodeAttentionMetadata
from omniflow.models.layers.qwen3 import KVCaches
from omniflow.models.qwen3_tts import inputs
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs, decoder_pass_graphs
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.decode_graph import TalkerDecodeGraphs
from omniflow.models.qwen3_tts.factory import TalkerBundle
from omniflow.models.qwen3_tts.pending_pcm import PendingPcm
from omniflow.models.qwen3_tts.predictor_graph import FrameSampleFn, PredictorGraphs
from omniflow.models.qwen3_tts.priming import ReferencePriming
from omniflow.models.qwen3_tts.prompt import TalkerPrompt
from omniflow.models.qwen3_tts.prompt_graph import PromptGraphs
from omniflow.models.qwen3_tts.stream_slots import StreamSlots
from omniflow.models.qwen3_tts.talker import Talker

SUBTALKER_TEMPERATURE = 0.9
"""The code predictor samples codebooks 1..15 at this temperature (the reference's), or
greedily when the request samples codebook 0 greedily."""
SUBTALKER_TOP_K = 50


class TalkerARModel:
    """`Talker` (+ an optional `StreamingDecoder`) behind the `ARModel` interface."""

    def __init__(
        self,
        talker: Talker,
        stream_decoder: StreamingDecoder | None = None,
        frame_graphs: PredictorGraphs | None = None,
        decode_graphs: bool = False,
        decoder_passes: dict[int, DecoderStepGraphs] | None = None,
        priming: ReferencePriming | None = None,
        prompt_graph_tokens: int = 0,
        audio_side_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.talker = talker
        self.frame_graphs = frame_graphs
        """CUDA graphs of the code predictor's 15 steps per batch bucket (None: eager)."""
        self.use_decode_graphs = decode_graphs
        self.decode_graphs: TalkerDecodeGraphs | None = None
        """CUDA graphs of the talker's decode step per batch bucket, built in `attach_kv`."""
        self.prompt_graph_tokens = prompt_graph_tokens
        self.prompt_graphs: PromptGraphs | None = None
        """Whole-context prefills up to `prompt_graph_tokens` tokens per token bucket (CUDA
        graphs when decode graphs are on; the same path eagerly otherwise), built in
        `attach_kv`; None: every prefill runs `Talker.forward`."""
        self.kv: KVLayout | None = None
        self.name = "talker"
        shape = talker.shape
        self.kv_spec = KVCacheSpec(shape.num_layers, shape.num_kv_heads, shape.head_dim)
        self.frame_width = talker.num_groups
        self.eos = talker.vocab.eos
        self.eos_frame: Frame = (self.eos,) + (0,) * (self.frame_width - 1)
        self.token_policy = TokenPolicy(
            vocab_size=shape.vocab_size,
            suppressed_ids=talker.vocab.suppressed_ids(shape.vocab_size),
            fallback_stop_ids=(self.eos,),
            frameless_ids=(self.eos,),
        )
        self.slots = StreamSlots(stream_decoder, decoder_passes, priming, audio_side_stream)
        # Two read-backs in flight: a window queues step n+1 before it reads step n.
        self.readback = Readback(depth=2)

    # ---------------------------------------------------------------- inputs

    def input_frame(self, token: int, output: Frame | None) -> Frame:
        return self.eos_frame if output is None else tuple(output)

    def side_id(self, payload: Any, step: int) -> int:
        prompt: TalkerPrompt = payload
        return prompt.trailing_at(step)

    def prefill_inputs(self, spans: Sequence[PositionSpan], device: torch.device) -> PrefillInputs:
        return inputs.prefill_inputs(spans, self.frame_width, device)

    # ---------------------------------------------------------------- compute

    def embed_prefill(self, x: PrefillInputs) -> torch.Tensor:
        return inputs.embed_prefill(self.talker, x)

    def embed_decode(self, x: DecodeInputs) -> torch.Tensor:
        return inputs.embed_decode(self.talker, x)

    def forward(
        self, embeds: Tensor, positions: Tensor, meta: AttentionMetadata, kv_caches: KVCaches
    ) -> Tensor:
        if self.prompt_graphs is not None and kv_caches is self.prompt_graphs.kv_caches:
            hidden = self.prompt_graphs.run(embeds, positions, meta)
            if hidden is not None:
                return hidden
        return self.talker.forward(embeds, positions, meta, kv_caches)

    def attach_kv(self, layout: KVLayout) -> None:
        self.kv = layout
        max_positions = layout.max_blocks * layout.block_size
        if self.prompt_graph_tokens:
            self.prompt_graphs = PromptGraphs(
                self.talker,
                layout.caches,
                max_tokens=self.prompt_graph_tokens,
                max_positions=max_positions,
                dummy_slot=layout.dummy_slot,
                capture=self.use_decode_graphs,
            )
            self.prompt_graphs.capture_all()
        if not self.use_decode_graphs:
            return
        self.decode_graphs = TalkerDecodeGraphs(
            self.talker,
            layout.caches,
            layout.block_size,
            max_batch=layout.max_batch,
            max_blocks=layout.max_blocks,
            max_positions=max_positions,
            dummy_slot=layout.dummy_slot,
        )
        self.decode_graphs.capture_all()

    @torch.no_grad()
    def decode_hidden(self, x: DecodeInputs, meta: DecodeAttentionMetadata) -> torch.Tensor:
        assert self.kv is not None, "attach_kv first"
        if self.decode_graphs is not None:
            return self.decode_graphs.run(
                x, meta.block_tables, meta.context_lens, meta.slot_mapping
            )
        return self.forward(self.embed_decode(x), x.positions, meta, self.kv.caches)

    @torch.no_grad()
    def queue_frames(self, hidden: torch.Tensor, sampler: RowSampler) -> QueuedFrames:
        """Codebook 0 with each request's own settings; then codebooks 1..15 by the code
        predictor under the subtalker policy; then the codes' copy to the host, started.

        Every row's frame is completed, EOS rows included, and their codes discarded: which
        rows are acoustic is learnt from the one read-back (codebook 0 and the frame
        together), so the predictor is queued right behind codebook 0 instead of after a
        device-to-host wait. A row's codes do not depend on the other rows (the draws are
        keyed by each row's seed and counter). An EOS row's next input frame is its code0
        alone, set on the device for every row that drew EOS, so the next step can be
        queued before the host has seen the codes."""
        code0 = sampler.draw(self.talker.logits(hidden), 0)
        full = self._complete(hidden, code0, sampler.with_policy(None, *_SUBTALKER))
        full[:, 1:].masked_fill_((code0 == self.eos)[:, None], 0)  # `full` is a fresh cat
        return QueuedFrames(code0, full, self.readback.start(full))

    def read_frames(self, queued: QueuedFrames) -> FrameSample:
        rows = self.readback.wait(queued.codes)  # column 0 is codebook 0
        tokens = tuple(row[0] for row in rows)
        pairs = zip(tokens, rows, strict=True)
        outputs = tuple(None if t == self.eos else tuple(row) for t, row in pairs)
        made = queued.codes.copied  # behind the codes' copy, so after `full` was made
        return FrameSample(tokens, outputs, queued.next_tokens, queued.next_frames, made)

    def _complete(self, hidden: torch.Tensor, code0: torch.Tensor, sub: RowSampler):
        if self.frame_graphs is None:
            return self.talker.complete_frames(hidden, code0, sub.draw)
        seeds, counters, temperature = sub.noise_keys()
        rest = self.frame_graphs.run(hidden, code0, seeds, counters, temperature)
        return torch.cat([code0[:, None], rest], dim=1)

    # ---------------------------------------------------------------- per-request state

    def admit(self, request_id: str) -> None:
        self.slots.admit(request_id)

    def finish(self, request_id: str) -> None:
        self.slots.finish(request_id)

    def preempt(self, request_id: str) -> None:
        self.slots.preempt(request_id)

    def queue_audio(self, steps: Sequence[SampledStep]) -> PendingPcm:
        return self.slots.queue(steps)

    def queue_audio_ahead(self, request_ids: Sequence[str], queued: QueuedFrames) -> PendingPcm:
        return self.slots.queue_ahead(request_ids, queued.next_frames, queued.codes.copied)

    def decoder_slots(self) -> tuple[int, int] | None:
        return self.slots.slots_in_use()

    def prompt_graph_counts(self) -> tuple[int, int]:
        if self.prompt_graphs is None:
            return (0, 0)
        return (self.prompt_graphs.served, self.prompt_graphs.replays)

    def parked_ids(self) -> frozenset[str]:
        return self.slots.parked_ids()


_SUBTALKER = (SUBTALKER_TEMPERATURE, SUBTALKER_TOP_K)


def build_ar_model(
    bundle: TalkerBundle,
    stream_decoder: StreamingDecoder | None = None,
    frame_sample: FrameSampleFn | None = None,
    max_batch: int = 0,
    decode_graphs: bool = False,
    priming: ReferencePriming | None = None,
    window_k: int = 0,
    prompt_graph_tokens: int = 0,
    audio_chunk_frames: int = 0,
    audio_pass_steps: int = 0,
) -> TalkerARModel:
    """The runner's model for a built talker; with `stream_decoder` it also emits PCM. With
    `frame_sample` (the runner's fixed-policy draw) the code predictor runs as CUDA graphs
    per batch bucket up to `max_batch`, captured now (eager on a device without graphs); with
    `decode_graphs` the talker's decode step does too, captured when the runner attaches
    its KV cache, and so does the streaming decoder's per-frame step (captured now). With
    `priming`, voice-clone requests' decoder slots are primed with their reference frames.
    With `window_k` > 1 and decode graphs, a window's `window_k` frames per request are
    decoded in one replay of a second set of decoder graphs at the window's end (fewer
    frames, a window cut short or a request's last, in passes of the powers of two below:
    `codec_graph.pass_sizes`); with `audio_chunk_frames` those graphs take that many frames,
    one replay per chunk, and on
    CUDA every decoder pass runs on a stream of its own (the runner queues a window's
    chunks while its later steps compute: `stream_slots.py`). With
    `prompt_graph_tokens`, whole-context prefills up to that many tokens run on the prompt
    path (`prompt_graph.py`: captured graphs when `decode_graphs`, else eagerly)."""
    graphs = None
    passes = None
    side = None
    if audio_chunk_frames and stream_decoder is not None and stream_decoder.device.type == "cuda":
        # high priority: another pool than the shared capture stream's (graphs captured on
        # one stream share a cuBLAS workspace), and a chunk's audio is the latency-bound work
        side = torch.cuda.Stream(stream_decoder.device, priority=-1)
    if decode_graphs and stream_decoder is not None:
        frames = (audio_chunk_frames or window_k) if window_k > 1 else 1
        frames = max(frames, audio_pass_steps)  # held frames decode in one pass too
        passes = decoder_pass_graphs(stream_decoder, max_batch, frames, side)
    if frame_sample is not None:
        talker = bundle.talker
        graphs = PredictorGraphs(
            talker.predictor,
            talker.weights.talker.model.codec_embedding,
            frame_sample,
            max_batch=max_batch,
        )
        graphs.capture_all()
    return TalkerARModel(
        bundle.talker,
        stream_decoder,
        graphs,
        decode_graphs,
        passes,
        priming,
        prompt_graph_tokens,
        side,
    )
