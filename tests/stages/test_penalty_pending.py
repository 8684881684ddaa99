"""The penalty history's count with tokens recorded but not yet read back: consistent rows
pass, an inconsistent one is refused rather than rebuilt without its pending tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from omniflow.sampling.penalty import PenaltyHistory


@dataclass
class Row:
    request_id: str
    tokens: list[int] = field(default_factory=list)


def test_pending_tokens_count_and_a_wrong_count_is_refused():
    h = PenaltyHistory(16, 2, torch.device("cpu"))
    row = Row("a", [3, 4])
    (slot,) = h.slots([row])  # allocated and built from the list
    h.record(torch.tensor([slot]), [slot], torch.tensor([7]))  # drawn, not yet read back
    assert h.slots([row], pending=1) == [slot]  # 2 read + 1 pending: consistent
    assert set(h.seen[slot].nonzero().flatten().tolist()) == {3, 4, 7}
    with pytest.raises(RuntimeError, match="2 read \\+ 2 pending"):
        h.slots([row], pending=2)
    row.tokens.append(7)  # read back: the plain count agrees again, nothing rebuilt
    assert h.slots([row]) == [slot] and h.recorded[slot] == 3
