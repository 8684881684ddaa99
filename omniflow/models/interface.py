"""What a generic AR runner needs from a model (`worker/ar_runner.py` drives any `ARModel`).

The runner owns scheduling state, the paged KV cache, input staging and sampling; the model
owns everything that depends on what its tokens mean: how a prompt payload becomes
per-position inputs, how a previous output feeds the next position, which ids may never be
sampled, how a full output frame is completed from the token that drives the AR loop, and any
per-request state of its own (a streaming audio decoder's slots).

Inputs come in two layouts. The prefill path (variable length, prompt positions and
recomputed outputs mixed) is built by the model from `PositionSpan`s. The decode path (every
scheduled request computes exactly one token) uses fixed-shape `DecodeInputs` the runner
fills from its own buffers, so a later CUDA graph can capture embed + forward over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from omniflow.core.audio import PendingAudio
from omniflow.device.readback import PendingCodes
from omniflow.models.layers.attention import AttentionMetadata, DecodeAttentionMetadata
from omniflow.models.layers.qwen3 import KVCaches

Frame = tuple[int, ...]
"""One output step's codes (G codebooks); element 0 is the token that drives the AR loop."""


@dataclass(frozen=True)
class KVCacheSpec:
    """The paged KV cache the runner allocates: one (K, V) pair per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class KVLayout:
    """The KV cache as the runner allocated it (handed to the model once, so a model can
    capture graphs over it: their tensor addresses are fixed from then on)."""

    caches: list[tuple[torch.Tensor, torch.Tensor]]
    block_size: int
    max_blocks: int
    """Block-table width: blocks of one request of max_model_len."""
    dummy_slot: int
    """A slot past the pool that nothing reads: padded rows of a graph bucket write there."""
    max_batch: int


@dataclass(frozen=True)
class TokenPolicy:
    """Which ids the runner bans while sampling the AR-loop token."""

    vocab_size: int
    suppressed_ids: tuple[int, ...]
    """Never sampled (ids reserved for control, not output)."""
    fallback_stop_ids: tuple[int, ...]
    """Banned while a request may not stop yet (min_new_tokens, ignore_eos) when it names no
    stop ids of its own."""
    frameless_ids: tuple[int, ...]
    """Ids whose row makes no frame (`FrameSample.outputs` None): a request that may draw one
    without stopping has no audio queued ahead of its read-back (`StepOps.audio_ahead`)."""


@dataclass(frozen=True)
class PositionSpan:
    """One request's positions [start, end) in a prefill-path step, with what the model needs
    to build their inputs: prompt positions come from the payload, later positions from the
    request's previous outputs."""

    payload: Any
    prompt_len: int
    start: int
    end: int
    frames: Sequence[Frame]
    """Input frame per output so far (`ARModel.input_frame`); output i feeds position
    prompt_len + i."""


@dataclass(frozen=True)
class PrefillInputs:
    """Flattened per-position inputs of a prefill-path step (T positions)."""

    side_ids: torch.Tensor
    """[T] int64: the side stream's id per position (a text id)."""
    codes: torch.Tensor
    """[T, G] int64 codes; entries where `code_mask` is False are ignored."""
    code_mask: torch.Tensor
    """[T, G] bool: which codes contribute at each position."""
    later_codes: bool = True
    """Whether any position has codes past column 0 (the host knows it while laying the
    mask out; True is always safe, as masked codes add nothing)."""
    added_rows: torch.Tensor | None = None
    """[K] int64 positions that get a vector added to their embedding (a voice-clone speaker
    embedding), or None."""
    added: torch.Tensor | None = None
    """[K, hidden] the vectors for `added_rows`."""


@dataclass(frozen=True)
class DecodeInputs:
    """Fixed-shape inputs of a decode-path step: row b computes one position."""

    tokens: torch.Tensor
    """[B] int64: the previous token (the AR-loop token of the previous output)."""
    frames: torch.Tensor
    """[B, G] int64: the previous output's input frame (`ARModel.input_frame`)."""
    side_ids: torch.Tensor
    """[B] int64: the side stream's id for this step (`ARModel.side_id`)."""
    positions: torch.Tensor
    """[B] int64."""


@dataclass(frozen=True)
class FrameSample:
    """What one sampling call produced for B rows."""

    tokens: tuple[int, ...]
    """Per row, the AR-loop token."""
    outputs: tuple[Frame | None, ...]
    """Per row, the model's per-token output (the full frame), None where the token ends
    the sequence (it carries no output)."""
    next_tokens: torch.Tensor
    """[B] int64 on the device: `tokens`, to feed the next decode step without the host."""
    next_frames: torch.Tensor
    """[B, G] int64 on the device: each row's input frame for its next position."""
    made: torch.cuda.Event | None = None
    """Recorded on the stream that made `next_frames`, right after it (CUDA; None
    elsewhere): another stream that reads the codes waits for this, not for whatever the
    producing stream queued later (the next step's frames)."""


@dataclass(frozen=True)
class QueuedFrames:
    """A sampling call queued on the device (`ARModel.queue_frames`): what the next decode
    step feeds, usable at once, and the codes on their way to the host (`read_frames`)."""

    next_tokens: torch.Tensor
    """[B] int64 on the device, as `FrameSample.next_tokens`."""
    next_frames: torch.Tensor
    """[B, G] int64 on the device, as `FrameSample.next_frames`."""
    codes: PendingCodes
    """The rows' codes, copying to the host."""


@dataclass(frozen=True)
class SampledStep:
    """One sampling call's rows: the request of each row, and what the call produced."""

    request_ids: tuple[str, ...]
    sample: FrameSample


class RowSampler(Protocol):
    """Draws one id per row with each row's own settings and seeded noise (the runner's
    sampler). The model decides what to sample; how the noise is drawn stays the runner's."""

    def draw(self, logits: torch.Tensor, stream: int) -> torch.Tensor:
        """[B, V] logits -> [B] ids, from noise stream `stream` (0: the AR-loop token)."""
        ...

    def with_policy(self, rows: torch.Tensor | None, temperature: float, top_k: int) -> RowSampler:
        """The same rows' seeds and counters (or a subset: `rows`) under one fixed policy:
        `temperature` where the request samples (greedy requests stay greedy), `top_k`, no
        top-p, no penalty, no bans."""
        ...

    def noise_keys(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(seeds [B], counters [B], temperature [B]) of these rows: what a captured frame
        (a CUDA graph with its own sampling) needs to draw exactly the noise `draw` would."""
        ...


class ARModel(Protocol):
    """A model a generic AR runner can serve."""

    name: str
    """What logs and error messages call it ("talker")."""
    kv_spec: KVCacheSpec
    frame_width: int
    """G: codes per output frame."""
    token_policy: TokenPolicy

    # ---------------------------------------------------------------- inputs

    def input_frame(self, token: int, output: Frame | None) -> Frame:
        """The frame a stored output feeds into the next position (an ending token has no
        output but still has an input frame)."""
        ...

    def side_id(self, payload: Any, step: int) -> int:
        """The side stream's id at decode step `step` (position prompt_len + step)."""
        ...

    def prefill_inputs(
        self, spans: Sequence[PositionSpan], device: torch.device
    ) -> PrefillInputs: ...

    # ---------------------------------------------------------------- compute

    def embed_prefill(self, inputs: PrefillInputs) -> torch.Tensor:
        """[T, H] input embeddings."""
        ...

    def embed_decode(self, inputs: DecodeInputs) -> torch.Tensor:
        """[B, H] input embeddings; no host synchronisation (graph-capturable)."""
        ...

    def forward(
        self, embeds: Tensor, positions: Tensor, meta: AttentionMetadata, kv_caches: KVCaches
    ) -> Tensor:
        """Hidden states [T, H] after the paged decoder (this step's K/V written)."""
        ...

    def attach_kv(self, layout: KVLayout) -> None:
        """Called once by the runner after allocating the KV cache."""
        ...

    def decode_hidden(self, x: DecodeInputs, meta: DecodeAttentionMetadata) -> torch.Tensor:
        """The decode path's hidden states [B, H] (embed + forward over the attached cache,
        this step's K/V written); a model may replay a captured graph here."""
        ...

    def queue_frames(self, hidden: torch.Tensor, sampler: RowSampler) -> QueuedFrames:
        """Sample each row's AR-loop token from its hidden state and complete its frame, all
        queued on the device; the codes' copy to the host is started, nothing waits. The next
        step's inputs (`next_tokens`, `next_frames`) are right for every row that goes on,
        whatever it sampled. Two calls may be outstanding (a window queues step n+1 before it
        reads step n); they are read in the order they were queued."""
        ...

    def read_frames(self, queued: QueuedFrames) -> FrameSample:
        """The sample, once its codes reached the host (work queued after `queue_frames`,
        such as the next step's forward, is not waited for)."""
        ...

    # ---------------------------------------------------------------- per-request state

    def admit(self, request_id: str) -> None:
        """A request joins (new, or resumed after preemption: parked state is restored)."""
        ...

    def finish(self, request_id: str) -> None:
        """A request ended for good: release its state, parked or not."""
        ...

    def preempt(self, request_id: str) -> None:
        """A request is preempted and will be recomputed: park the state recompute cannot
        rebuild, release the rest."""
        ...

    def queue_audio(self, steps: Sequence[SampledStep]) -> PendingAudio:
        """After one or more consecutive sampling calls (a step, or a window's steps, or a
        chunk of them): PCM per request for all the frames they produced, in order (empty
        when the model does not stream-decode; rows whose output is None produce none), to
        be read with `result()`. Deferring a window's audio lets the decoder take each
        request's frames in one pass; a model may decode while the caller goes on (a
        window's later steps), so the caller reads the result last."""
        ...

    def queue_audio_ahead(self, request_ids: Sequence[str], queued: QueuedFrames) -> PendingAudio:
        """One sampling call's audio, every row's frame, queued before its codes are read
        back (`read_frames`): the host's decoder calls overlap the device's sampling instead
        of following the read-back. A row that drew a stop token has no frame: what its row
        decodes is not audio (the caller drops it) and its request must end with this step.
        Only for a model with stream decode (`decoder_slots`)."""
        ...

    def decoder_slots(self) -> tuple[int, int] | None:
        """(in use, total) streaming-decoder slots; None without stream decode."""
        ...

    def prompt_graph_counts(self) -> tuple[int, int]:
        """(prefill forwards run on prompt graphs, replays they took) so far; (0, 0) for a
        model without them."""
        ...

    def parked_ids(self) -> frozenset[str]:
        """Preempted requests whose state waits to be restored."""
        ...
