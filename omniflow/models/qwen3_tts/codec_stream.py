"""The one frame-exact streaming codec decoder, used by code2wav and the fused talker.

Each request owns a slot in a pool of carried state (conv histories, transposed-conv
carries, a 72-frame KV window per transformer layer, and its frame position). `decode`
takes any number of new frames for any set of slots, continues each from where it left
off, and returns exactly 1,920 samples per frame. Rows with the same number of new frames
run as one batch; a ragged batch runs as one batch per distinct length.
"""

from __future__ import annotations

import torch

from omniflow.models.qwen3_tts.codec_modules import CodecDecoder


class SlotsExhausted(RuntimeError):
    """No free decoder slot: the caller must wait or refuse the request."""


class StreamingDecoder:
    """A pool of per-request decoder slots over one `CodecDecoder`."""

    def __init__(
        self, decoder: CodecDecoder, num_slots: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.decoder = decoder
        self.num_slots = num_slots
        self.samples_per_frame = decoder.samples_per_frame
        self._shapes = decoder.state_shapes()
        self._pool = {
            name: torch.zeros((num_slots, *shape), device=device, dtype=dtype)
            for name, shape in self._shapes.items()
        }
        self._pos = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self._free = list(range(num_slots - 1, -1, -1))
        self.device = device

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_in_use(self) -> int:
        return self.num_slots - len(self._free)

    def allocate(self) -> int:
        """A zeroed slot (a fresh request starts from silence, as the full decode does)."""
        if not self._free:
            raise SlotsExhausted(f"all {self.num_slots} decoder slots are in use")
        slot = self._free.pop()
        for t in self._pool.values():
            t[slot].zero_()
        self._pos[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not allocated")
        self._free.append(slot)

    def position(self, slot: int) -> int:
        """Frames decoded so far in this slot."""
        return int(self._pos[slot])

    def snapshot(self, slot: int) -> dict[str, torch.Tensor]:
        """A copy of a slot's state (preemption saves it; `restore` puts it back)."""
        snap = {name: t[slot].clone() for name, t in self._pool.items()}
        snap["__pos__"] = self._pos[slot].clone()
        return snap

    def restore(self, slot: int, snap: dict[str, torch.Tensor]) -> None:
        for name, t in self._pool.items():
            t[slot].copy_(snap[name])
        self._pos[slot] = snap["__pos__"]

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
            pcm = self.decoder.stream(batch, pos, state)
            for name, t in self._pool.items():
                t.index_copy_(0, idx, state[name].to(t.dtype))
            self._pos.index_copy_(0, idx, pos + n)
            for j, i in enumerate(rows):
                out[i] = pcm[j]
        return [o for o in out if o is not None]
