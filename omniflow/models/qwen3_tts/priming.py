"""Reference priming of the streaming codec decoder (voice clone; docs/architecture.md,
"Reference priming").

A Base-model request may carry its reference audio's codec frames (`SpeechRequest.ref_codes`).
The stage that decodes audio (the fused talker, or code2wav) primes the request's decoder
slot with the last `ref_context_frames` of them before its first generated frame, and
discards their PCM: the first frame is then decoded in the reference's context (its KV
window and conv histories), as the official implementation decodes reference + generated
codes together and cuts the reference's audio off.

The request's codes are known when its stage request is made (on the caller's thread); the
slot is taken when its first frame is decoded (on the stage's thread). `ReferencePriming`
holds the codes in between. An entry leaves when the slot takes it, when the request
finishes, or when the stage request object is collected (a request cancelled before it ever
reached the runner), so nothing accumulates.
"""

from __future__ import annotations

import threading
import weakref

import torch

from omniflow.core.speech import SpeechRequest


class ReferencePriming:
    """Reference frames waiting for their request's decoder slot, by request id."""

    def __init__(self, frames: int | None) -> None:
        self.frames = frames
        """The stage's resolved `ref_context_frames` (None: the stage takes no reference;
        0: no priming)."""
        self._lock = threading.RLock()  # an owner's finalizer may run inside a locked block
        self._pending: dict[str, torch.Tensor] = {}

    def codes_for(self, speech: SpeechRequest) -> torch.Tensor | None:
        """The last `frames` reference frames of `speech` as [n, 16] int64, or None (no
        reference codes, or no priming)."""
        if not self.frames or not speech.ref_codes:
            return None
        return torch.tensor(speech.ref_codes[-self.frames :], dtype=torch.int64)

    def register(self, speech: SpeechRequest, owner: object) -> None:
        """Hold `speech`'s priming codes until its slot is taken; dropped with `owner` (the
        stage's request object) if that never happens. A second request with a live id does
        not replace the first's codes (the orchestrator refuses it anyway)."""
        codes = self.codes_for(speech)
        if codes is None:
            return
        rid = speech.request_id
        with self._lock:
            if rid in self._pending:
                return
            self._pending[rid] = codes
        weakref.finalize(owner, self._forget, rid, codes)

    def take(self, request_id: str) -> torch.Tensor | None:
        """The request's priming codes, once (its slot was just allocated), or None."""
        with self._lock:
            return self._pending.pop(request_id, None)

    def discard(self, request_id: str) -> None:
        """The request finished (perhaps before its first frame)."""
        self.take(request_id)

    def _forget(self, request_id: str, codes: torch.Tensor) -> None:
        with self._lock:
            if self._pending.get(request_id) is codes:
                del self._pending[request_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)
