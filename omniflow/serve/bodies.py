"""The bodies of streamed speech responses: raw PCM/WAV bytes, or server-sent events.

Each takes a request's audio events (`SpeechResponse.audio_events`) and yields the bytes to
send; `PacedStream` sends them.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

from omniflow.core.events import AudioEvent
from omniflow.serve.encoders import pcm16, sse_event, wav_header
from omniflow.serve.sending import StreamBroken


async def raw_stream(events: AsyncIterator[AudioEvent], fmt: str, sr: int) -> AsyncIterator[bytes]:
    """Streamed pcm or wav: PCM16 as it comes, a WAV stream's first chunk behind a header with
    unknown sizes (sent together: the first bytes carry audio, and one send fewer)."""
    header = wav_header(sr) if fmt == "wav" else b""
    async for ev in events:
        if ev.pcm is not None:
            yield header + pcm16(ev.pcm)
            header = b""
        if ev.error:
            raise StreamBroken(f"generation failed mid-stream: {ev.error}")


async def sse(events: AsyncIterator[AudioEvent], fmt: str, sr: int) -> AsyncIterator[bytes]:
    """`speech.audio.delta` (base64 PCM16, or WAV bytes after a header for wav),
    `speech.audio.done` with usage, or `speech.audio.error`."""
    samples = 0
    frames = 0
    header_sent = fmt != "wav"
    async for ev in events:
        frames = ev.frames or frames
        if ev.pcm is not None:
            chunk = pcm16(ev.pcm)
            if not header_sent:
                chunk = wav_header(sr) + chunk
                header_sent = True
            samples += ev.pcm.size
            yield sse_event(
                {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
            )
        if ev.finished:
            if ev.error:
                yield sse_event({"type": "speech.audio.error", "error": {"message": ev.error}})
            else:
                usage = {
                    "audio_seconds": samples / sr,
                    "output_frames": frames,
                    "finish_reason": ev.finish_reason,
                }
                yield sse_event({"type": "speech.audio.done", "usage": usage})
