"""The one frame-exact streaming codec decoder, used by code2wav and the fused talker.

Each request owns a slot in a pool of carried state (conv histories, transposed-conv
carries, a 72-frame KV window per transformer layer, and its frame position). `decode`
takes any number of new frames for any set of slots, continues each from where it left
off, and returns exactly 1,920 samples per frame. Rows with the same number of new frames
run as one batch; a ragged batch runs as one batch per distinct length.

`decode_step` is the fused talker's per-step case (one frame per row) from device tensors only,
so that `codec_graph.DecoderStepGraphs` can record it as a CUDA graph: it gathers the rows'
state by a slot-id tensor, reads no value back to the host, and scatters the state back. A
graph has a fixed batch, so the pool keeps one more slot than it hands out, `padding_slot`,
which a bucket's padding rows read and write and nothing else ever reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from omniflow.device.upload import upload_ints
from omniflow.models.layers.rope_table import RopeTable
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.codec_modules import CodecDecoder

ROPE_FRAMES = 4096
"""Frame positions `decode_step` takes from a precomputed RoPE table (327 s of audio; the
fused talker's max_model_len bounds a request's frames below that by default)."""


class SlotsExhausted(RuntimeError):
    """No free decoder slot: the caller must wait or refuse the request."""


def nonfinite(dtype: torch.dtype, request_ids: Sequence[str], rows: np.ndarray) -> list[str]:
    """The requests whose decoded PCM (`rows`, one per request) holds inf or NaN. Only a
    reduced-precision decoder is checked: float16's range (65,504) is the one risk the
    float32 path does not have, and an overflow would otherwise reach the listener as
    noise."""
    if dtype == torch.float32 or not len(request_ids):
        return []
    ok = np.isfinite(rows.reshape(len(request_ids), -1)).all(axis=1)
    return [rid for rid, fine in zip(request_ids, ok, strict=True) if not fine]


def overflow_error(dtype: torch.dtype) -> str:
    """What a request whose PCM `nonfinite` found is told."""
    name = str(dtype).removeprefix("torch.")
    return (
        f"the codec decoder's {name} PCM is not finite (its range was exceeded); set "
        "model.codec_dtype=float32"
    )


class StepRope:
    """RoPE for `decode_step` with no host read.

    Positions below `frames` are rows of a `RopeTable` built from the transformer's own
    `Rotary` in float32 (its table dtype) and cast per lookup as `Rotary.cos_sin` casts them:
    bitwise what `decode` uses. A stream can outlive any fixed table, and an index past a table
    is a device assert on CUDA (fatal to the process), so later positions are computed on the
    device with `Rotary`'s formula (float64 angles, float32 cos/sin) rather than clamped: the
    audio stays right, equal to `decode`'s to within the last float32 bit.
    """

    def __init__(self, rotary: Rotary, frames: int, device: torch.device) -> None:
        self.table = RopeTable(rotary, frames, device, torch.float32)
        self.inv_freq = rotary.inv_freq.to(device)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        last = self.table.max_positions - 1
        cos, sin = self.table.lookup(positions.clamp(max=last))
        freqs = positions.double()[..., None] * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        inside = (positions <= last)[..., None]
        cos = torch.where(inside, cos, angles.cos().float())
        sin = torch.where(inside, sin, angles.sin().float())
        return cos.to(dtype), sin.to(dtype)


class StreamingDecoder:
    """A pool of per-request decoder slots over one `CodecDecoder`.

    The pool holds `num_slots + 1` rows: slots 0..num_slots-1 are handed out by `allocate`;
    row `padding_slot` (= num_slots) is never handed out and only `decode_step`'s padding rows
    use it. `rope_frames`: positions `decode_step` looks up in a table (see `StepRope`)."""

    def __init__(
        self,
        decoder: CodecDecoder,
        num_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        rope_frames: int = ROPE_FRAMES,
    ) -> None:
        self.decoder = decoder
        self.num_slots = num_slots
        self.padding_slot = num_slots
        self.samples_per_frame = decoder.samples_per_frame
        self.num_codebooks = decoder.shape.num_quantizers
        self.codebook_size = decoder.shape.codebook_size
        self._shapes = decoder.state_shapes()
        rows = num_slots + 1
        self._rows = torch.zeros(
            (rows, sum(math.prod(shape) for shape in self._shapes.values())),
            device=device,
            dtype=dtype,
        )
        """Every slot's carried state in one row: a slot is zeroed, saved or restored by one
        op, not one per state tensor (dozens)."""
        self._pool: dict[str, torch.Tensor] = {}
        """Each state tensor of every slot: a view of its columns of `_rows`."""
        start = 0
        for name, shape in self._shapes.items():
            size = math.prod(shape)
            self._pool[name] = self._rows[:, start : start + size].view(rows, *shape)
            start += size
        self._pos = torch.zeros(rows, dtype=torch.int64, device=device)
        self._free = list(range(num_slots - 1, -1, -1))
        self.device = device
        self.dtype = dtype
        self.fused = device.type == "cuda"
        """The decoder's convolution epilogues in our Triton kernels (`codec_fused.py`):
        on CUDA, where Triton runs; torch's modules elsewhere."""
        # Built now: building reads the largest position back to the host.
        self._rope = StepRope(decoder.pre_transformer.rotary, rope_frames, device)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_in_use(self) -> int:
        return self.num_slots - len(self._free)

    def allocate(self) -> int:
        """A zeroed slot (a fresh request starts from silence, as the full decode does)."""
        return self.allocate_many(1)[0]

    def allocate_many(self, n: int) -> list[int]:
        """n zeroed slots, in the order `allocate` would hand them out; none taken when fewer
        are free. Zeroing is two fills for all n (the state's rows, the positions): a fill
        per state tensor per request would be dozens of launches on the way to a new
        request's first audio."""
        if not self._free and n:
            raise SlotsExhausted(f"all {self.num_slots} decoder slots are in use")
        if n > len(self._free):
            raise SlotsExhausted(
                f"{n} decoder slots asked for, {len(self._free)} of {self.num_slots} free"
            )
        slots = [self._free.pop() for _ in range(n)]
        if n == 1:
            self._rows[slots[0]].zero_()
            self._pos[slots[0]] = 0
        elif n:
            idx = upload_ints(slots, self.device)
            self._rows.index_fill_(0, idx, 0)
            self._pos.index_fill_(0, idx, 0)
        return slots

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not allocated")
        self._free.append(slot)

    def position(self, slot: int) -> int:
        """Frames decoded so far in this slot."""
        return int(self._pos[slot])

    def snapshot(self, slot: int) -> dict[str, torch.Tensor]:
        """A copy of a slot's state (preemption saves it; `restore` puts it back): its row
        of carried state and its position."""
        return {"state": self._rows[slot].clone(), "position": self._pos[slot].clone()}

    def restore(self, slot: int, snap: dict[str, torch.Tensor]) -> None:
        self._rows[slot].copy_(snap["state"])
        self._pos[slot] = snap["position"]

    @torch.no_grad()
    def decode(self, slots: list[int], codes: list[torch.Tensor]) -> list[torch.Tensor]:
        """codes[i]: [n_i, 16] new frames of slots[i]; returns PCM [n_i * 1920] per row."""
        if len(slots) != len(codes) or len(set(slots)) != len(slots):
            raise ValueError("decode needs one code tensor per distinct slot")
        out: list[torch.Tensor | None] = [None] * len(slots)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(codes):
            groups.setdefault(int(c.shape[0]), []).append(i)
        for n, rows in groups.items():
            if n == 0:
                for i in rows:
                    out[i] = torch.zeros(0, device=self.device)
                continue
            idx = torch.tensor([slots[i] for i in rows], device=self.device)
            state = {name: t.index_select(0, idx) for name, t in self._pool.items()}
            pos = self._pos.index_select(0, idx)
            batch = torch.stack([codes[i].to(self.device) for i in rows])
            pcm = self.decoder.stream(batch, pos, state, fused=self.fused)
            for name, t in self._pool.items():
                t.index_copy_(0, idx, state[name].to(t.dtype))
            self._pos.index_copy_(0, idx, pos + n)
            for j, i in enumerate(rows):
                out[i] = pcm[j]
        return [o for o in out if o is not None]

    @torch.no_grad()
    def prime(self, slots: list[int], codes: list[torch.Tensor]) -> None:
        """Voice clone: run reference frames codes[i] [n_i, 16] through freshly allocated
        slots[i] and discard their PCM, so the request's first generated frame is decoded in
        the reference's context (its KV window and conv histories) rather than from silence.

        The same `decode` as any chunk (rows with the same number of frames run as one batch),
        eager even where the per-frame step replays CUDA graphs: the state lands in the pool
        tensors in place, which is all the recorded step reads."""
        self.decode(slots, codes)

    @torch.no_grad()
    def decode_step(self, slot_ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """n new frames per row: codes [B, 16] (n = 1) or [B, n, 16] int64 of slots
        `slot_ids` [B] int64, both on the decoder's device -> PCM [B, n * 1920]. Exactly
        what `decode` computes for the same rows (and the same state left behind), from
        device ops only: no host read and no shape that depends on a value, so a CUDA graph
        can record it.

        Nothing is checked (a check would read the host): `slot_ids` must be distinct
        allocated slots, except `padding_slot`, which may repeat (its rows' results and
        state are garbage that nothing reads)."""
        frames = codes.unsqueeze(1) if codes.dim() == 2 else codes
        state = {name: t.index_select(0, slot_ids) for name, t in self._pool.items()}
        pos = self._pos.index_select(0, slot_ids)
        pcm = self.decoder.stream(frames, pos, state, self._rope, fused=self.fused)
        for name, t in self._pool.items():
            t.index_copy_(0, slot_ids, state[name].to(t.dtype))
        self._pos.index_copy_(0, slot_ids, pos + frames.shape[1])
        return pcm
