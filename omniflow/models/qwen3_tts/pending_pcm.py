"""A decoder call's PCM on its way to the host: the pinned copies queued behind the decoder's
work on its stream, waited for by whoever reads the result (`StreamSlots.queue`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from omniflow.core.audio import AudioFailed
from omniflow.models.qwen3_tts.codec_stream import nonfinite, overflow_error


class PendingPcm:
    """A decoder call's PCM per request, copying to the host: `result()` waits for it.

    On CUDA each part is one device-to-host copy into pinned memory, queued on the stream
    that decoded it, with an event after them all; elsewhere the parts are already on the
    host."""

    def __init__(
        self,
        order: tuple[str, ...],
        parts: list[tuple[list[str], torch.Tensor]],
        stream: torch.cuda.Stream | None = None,
        dtype: torch.dtype = torch.float32,
        keep: Mapping[str, int] | None = None,
    ) -> None:
        self.order = order
        """The requests, in the order their PCM is returned."""
        self.parts = parts
        self.dtype = dtype
        """The decoder's: below float32 the PCM is checked for overflow (`nonfinite`)."""
        self.keep = dict(keep or {})
        """Samples to keep of a request's row, where a pass ran past its last frame (the
        rest is padding, never heard nor checked); rows not named keep all."""
        self.done: torch.cuda.Event | None = None
        """Recorded on `stream` (the decoder's, CUDA) after the copies to the host."""
        if stream is not None and parts:
            self.done = torch.cuda.Event()
            self.done.record(stream)

    def result(self) -> dict[str, np.ndarray]:
        """PCM per request, copied out of the pinned buffers: they go back to torch's pinned
        cache at once instead of riding along in the audio events (a whole response would
        hold its pass's buffer until the request ends, and torch never frees pinned memory).
        `AudioFailed` for the rows a reduced-precision decoder overflowed in."""
        if self.done is not None:
            self.done.synchronize()
        pcm: dict[str, np.ndarray] = {}
        bad: dict[str, str] = {}
        for rids, host in self.parts:
            rows = host.numpy()
            for i, rid in enumerate(rids):
                if rid in self.keep:
                    rows[i, self.keep[rid] :] = 0  # padding: whatever it holds is not audio
            for rid in nonfinite(self.dtype, rids, rows):
                bad[rid] = overflow_error(self.dtype)
            for rid, row in zip(rids, rows, strict=True):
                row = row[: self.keep.get(rid, len(row))]
                # each row its own array out of pinned memory: none keeps a pass's batch
                pcm[rid] = row.copy() if self.done is not None else row
        good = {rid: pcm[rid] for rid in self.order if rid not in bad}
        if bad:
            raise AudioFailed(bad, good)
        return good


def to_host(pcm: torch.Tensor) -> torch.Tensor:
    """`pcm` on the host; from CUDA, copying into pinned memory without a wait (read it only
    after the stream's work is done: `PendingPcm.result`)."""
    if pcm.device.type != "cuda":
        return pcm
    host = torch.empty(pcm.shape, dtype=pcm.dtype, pin_memory=True)
    return host.copy_(pcm, non_blocking=True)
