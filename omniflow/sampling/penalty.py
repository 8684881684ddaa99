"""The repetition penalty's history as a device-resident mask, kept up to date per step.

The penalty applies to every id a request has sampled so far. Rebuilding that set on the host
each step (a sort of the whole history per row, then an upload) costs O(history) per row per
step, host time that grows with every frame (measured: docs/performance.md, "Sampling and
prefill host time"). Here each request owns one row of a [slots, V] bool mask on the device; a
step marks the ids it sampled with one scatter (`record`), and a sampling call gathers its
rows' masks (`rows`). Nothing grows with the history, and nothing is read back.

The mask stays exactly the set of a request's tokens: a row is rebuilt from the host's token
list whenever the count it has recorded differs from that list's length plus the tokens a
caller says are recorded but not yet read back (`pending`; a request admitted
with tokens after preemption, a caller that appended tokens by other means), so `rows` is
correct whatever happened before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class HistoryRow(Protocol):
    request_id: str
    tokens: list[int]


class PenaltyHistory:
    """Per-request seen-id masks in one device tensor, slots reused as requests leave."""

    def __init__(self, vocab_size: int, capacity: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.seen = torch.zeros(capacity, vocab_size, dtype=torch.bool, device=device)
        self.slot_of: dict[str, int] = {}
        self.recorded: list[int] = [0] * capacity
        """Per slot, how many of its request's tokens the mask holds."""
        self.free = list(range(capacity - 1, -1, -1))
        self.true = torch.ones((), dtype=torch.bool, device=device)
        """The value the marks write, kept on the device: `seen[slots, ids] = True` copies a
        host scalar to the device, and that copy waits for all the work queued before it,
        leaving the GPU idle behind it."""

    def release(self, request_id: str) -> None:
        """The request left (finished, aborted or preempted): its slot may be reused."""
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self.free.append(slot)

    def slots(self, rows: Sequence[HistoryRow], pending: int = 0) -> list[int]:
        """Each row's slot, with its mask brought in line with its token list. `pending`:
        tokens each row has sampled and recorded here that its list does not hold yet (a
        window queues step n+1's draw before the host reads step n's token). Without
        pending tokens a row whose mask holds another count is rebuilt from its list; with
        them that would drop the pending tokens, so it is refused (a caller's bug)."""
        out = []
        for r in rows:
            slot = self.slot_of.get(r.request_id)
            if slot is None:
                slot = self._allocate(r.request_id)
            if self.recorded[slot] != len(r.tokens) + pending:
                if pending:
                    raise RuntimeError(
                        f"{r.request_id}: penalty history holds {self.recorded[slot]} tokens, "
                        f"expected {len(r.tokens)} read + {pending} pending"
                    )
                self._rebuild(slot, r.tokens)
            out.append(slot)
        return out

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        """[B, V] bool: the masks of these slots (device index tensor)."""
        return self.seen.index_select(0, slots)

    def record(self, slots: torch.Tensor, host_slots: Sequence[int], ids: torch.Tensor) -> None:
        """Row i sampled ids[i] (device tensor): mark it in slot slots[i]. `host_slots` are the
        same slots as ints, for the counts."""
        self.seen.index_put_((slots, ids), self.true)
        for s in host_slots:
            self.recorded[s] += 1

    def _allocate(self, request_id: str) -> int:
        if not self.free:
            grow = self.seen.shape[0]
            extra = torch.zeros(grow, self.vocab_size, dtype=torch.bool, device=self.device)
            self.seen = torch.cat([self.seen, extra])
            self.recorded.extend([0] * grow)
            self.free = list(range(2 * grow - 1, grow - 1, -1))
        slot = self.free.pop()
        self.slot_of[request_id] = slot
        self.recorded[slot] = -1  # forces a rebuild, even for an empty history
        return slot

    def _rebuild(self, slot: int, tokens: list[int]) -> None:
        self.seen[slot].zero_()
        if tokens:
            ids = torch.tensor(tokens, dtype=torch.int64).to(self.device, non_blocking=True)
            self.seen[slot].index_put_((ids,), self.true)
        self.recorded[slot] = len(tokens)
