"""The AR runner's two input paths: prefill (mixed, variable length) and decode (one token
per request, the steady state).

Prefill path (`build_prefill`): any mix of prompt chunks, recomputed outputs and decode
tokens. The model lays out the per-position inputs from `PositionSpan`s; the runner adds
positions, the slot mapping and each request's context slots. It is built from host lists
per step: these steps are rare once a server is busy.

Decode path (`DecodeBatch`): every scheduled request computes its next token. Inputs live in
persistent fixed-shape buffers ([B] previous tokens, [B, G] previous frames, [B] side ids,
[B] positions, [B, max_blocks] block tables, [B] context lengths; B <= max_num_seqs), filled
in place on the host and moved with one non_blocking copy each (`device/staging.py`).
`load` lays a batch out once; `advance` then moves it one step on the device, feeding the
tokens and frames just sampled, so a window replays K steps without rebuilding anything;
rows that leave are compacted out in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import SamplingParams
from omniflow.device.staging import StagedBuffer, Staging
from omniflow.models.interface import (
    ARModel,
    DecodeInputs,
    Frame,
    PositionSpan,
    PrefillInputs,
)
from omniflow.models.layers.attention import (
    AttentionMetadata,
    DecodeAttentionMetadata,
    PaddedIndex,
    PagedAttentionMetadata,
)


@dataclass
class RunnerRequest:
    """What the runner holds for one request."""

    request_id: str
    payload: Any
    prompt_len: int
    sampling: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed: int
    tokens: list[int] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    """Input frame per output token (`ARModel.input_frame`)."""

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.tokens)

    @property
    def in_decode(self) -> bool:
        """Its next position is the last known one, and an output (not the prompt) feeds it."""
        return self.num_computed >= self.prompt_len and self.num_computed + 1 == self.num_tokens


PADDED_MAX_CELLS = 1 << 20
"""Largest requests x longest-context product laid out as one padded batch; above it (a long
recompute beside many short prompts) the step attends request by request instead of
gathering mostly padding."""


@dataclass(frozen=True)
class PrefillBatch:
    inputs: PrefillInputs
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: list[tuple[RunnerRequest, int]]
    """Requests whose step reaches the end of their known tokens, with their row."""


def build_prefill(
    model: ARModel,
    order: Sequence[tuple[RunnerRequest, int]],
    block_size: int,
    device: torch.device,
    batched: bool,
) -> PrefillBatch:
    spans: list[PositionSpan] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    sample_rows: list[tuple[RunnerRequest, int]] = []
    bs = block_size
    for r, n in order:
        start, end = r.num_computed, r.num_computed + n
        if end > r.num_tokens:
            raise ValueError(
                f"{r.request_id}: plan runs to {end} but only {r.num_tokens} tokens known"
            )
        spans.append(PositionSpan(r.payload, r.prompt_len, start, end, r.frames))
        for pos in range(start, end):
            positions.append(pos)
            slots.append(r.block_ids[pos // bs] * bs + pos % bs)
        starts.append(len(positions))
        seq_lens.append(end)
        if end == r.num_tokens:
            sample_rows.append((r, len(positions) - 1))
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    meta: AttentionMetadata
    if batched and len(positions) == len(order):  # every request: 1 token
        width = max(-(-end // bs) for end in seq_lens)
        tables = [r.block_ids[:width] + [0] * (width - len(r.block_ids[:width])) for r, _ in order]
        meta = DecodeAttentionMetadata.from_tables(
            slot_mapping,
            torch.tensor(tables, dtype=torch.int32, device=device),
            torch.tensor(seq_lens, dtype=torch.int32, device=device),
            bs,
            tuple(seq_lens),
            batched=True,
        )
    else:
        context: list[list[int]] = []
        for (r, _), end in zip(order, seq_lens, strict=True):
            ids = np.asarray(r.block_ids[: -(-end // bs)], dtype=np.int64)
            context.append(((ids[:, None] * bs + np.arange(bs)).ravel()[:end]).tolist())
        padded = None
        if batched and len(order) * max(seq_lens) <= PADDED_MAX_CELLS:
            padded = PaddedIndex.from_lengths(tuple(starts), tuple(seq_lens), context, device)
        # Padded: the per-request tensors are not needed (one index serves every layer).
        per_request = () if padded else tuple(torch.tensor(c, device=device) for c in context)
        meta = PagedAttentionMetadata(
            slot_mapping, tuple(starts), tuple(seq_lens), per_request, padded
        )
    return PrefillBatch(
        inputs=model.prefill_inputs(spans, device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        meta=meta,
        sample_rows=sample_rows,
    )


class DecodeBatch:
    """Persistent decode-path inputs for up to `max_num_seqs` rows."""

    def __init__(
        self, model: ARModel, config: SchedulerConfig, device: torch.device, batched: bool
    ) -> None:
        self.model = model
        self.block_size = config.block_size
        self.batched = batched
        rows = config.max_num_seqs
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.staging = st = Staging(device)
        i64 = torch.int64
        self.tokens = st.buffer((rows,), i64)
        self.frames = st.buffer((rows, model.frame_width), i64)
        self.positions = st.buffer((rows,), i64)
        self.block_tables = st.buffer((rows, self.max_blocks), torch.int32)
        self.context_lens = st.buffer((rows,), torch.int32)
        self.side_ids = st.buffer((1, rows), i64)
        """[steps, rows]: the side id of every step of a window, laid out at `load`."""
        self.keep = st.buffer((rows,), i64)
        """The rows `select` keeps, uploaded from pinned memory: a pageable copy would make
        the host wait for all the work queued so far (the overlapped next forward too)."""
        self.rows = 0
        self.step = 0
        self.seq_lens: list[int] = []

    def load(self, reqs: Sequence[RunnerRequest], steps: int) -> None:
        """Lay out `reqs` (each `in_decode`) for up to `steps` decode steps."""
        b = len(reqs)
        if b > self.tokens.capacity:
            raise ValueError(f"{b} decode rows; the batch holds {self.tokens.capacity}")
        st = self.staging
        st.begin()
        if steps > self.side_ids.capacity:
            self.side_ids = st.buffer((steps, self.tokens.capacity), torch.int64)
        for i, r in enumerate(reqs):
            j = r.num_computed - r.prompt_len  # the output that feeds this position
            if len(r.block_ids) > self.max_blocks:
                raise ValueError(f"{r.request_id}: {len(r.block_ids)} blocks > max_model_len")
            self.tokens.np[i] = r.tokens[j]
            self.frames.np[i] = r.frames[j]
            self.positions.np[i] = r.num_computed
            self.block_tables.np[i, : len(r.block_ids)] = r.block_ids
            self.block_tables.np[i, len(r.block_ids) :] = 0
            self.context_lens.np[i] = r.num_computed + 1
            for s in range(steps):
                self.side_ids.np[s, i] = self.model.side_id(r.payload, j + s)
        for buf in self._per_row():
            buf.upload(b)
        # whole rows: a [:steps, :b] view is strided, and torch copies a strided pinned view
        # through a pageable temporary, which waits for the queued work
        self.side_ids.dev[:steps].copy_(self.side_ids.host[:steps], non_blocking=True)
        st.end()
        self.rows, self.step = b, 0
        self.seq_lens = [r.num_computed + 1 for r in reqs]

    def _per_row(self) -> tuple[StagedBuffer, ...]:
        return (self.tokens, self.frames, self.positions, self.block_tables, self.context_lens)

    def inputs(self) -> tuple[DecodeInputs, DecodeAttentionMetadata]:
        """This step's inputs and attention metadata (the slot mapping from the block
        tables, on the device)."""
        b, bs = self.rows, self.block_size
        pos = self.positions.dev[:b]
        tables = self.block_tables.dev[:b]
        block = tables.gather(1, (pos // bs)[:, None]).squeeze(1).to(torch.int64)
        meta = DecodeAttentionMetadata.from_tables(
            block * bs + pos % bs,
            tables,
            self.context_lens.dev[:b],
            bs,
            tuple(self.seq_lens),
            self.batched,
        )
        x = DecodeInputs(
            tokens=self.tokens.dev[:b],
            frames=self.frames.dev[:b],
            side_ids=self.side_ids.dev[self.step, :b],
            positions=pos,
        )
        return x, meta

    def advance(
        self, next_tokens: torch.Tensor, next_frames: torch.Tensor, keep: list[int]
    ) -> None:
        """One step on: feed the sampled tokens [B] and frames [B, G] (device), move
        positions and lengths by one, and keep only rows `keep` (ascending) for the next
        step."""
        b = self.rows
        self.tokens.dev[:b].copy_(next_tokens)
        self.frames.dev[:b].copy_(next_frames)
        self.positions.dev[:b] += 1
        self.context_lens.dev[:b] += 1
        self.seq_lens = [n + 1 for n in self.seq_lens]
        self.step += 1
        self.select(keep)

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (ascending indices of the current rows), in order."""
        b = self.rows
        if len(keep) < b:
            n = len(keep)
            self.staging.begin()
            self.keep.np[:n] = keep
            idx = self.keep.upload(n)
            self.staging.end()
            for buf in self._per_row():
                buf.dev[:n] = buf.dev[:b].index_select(0, idx)
            side = self.side_ids.dev
            side[:, :n] = side[:, :b].index_select(1, idx)
            self.seq_lens = [self.seq_lens[i] for i in keep]
        self.rows = len(keep)
