"""`omniflow serve`'s settings: a module of their own, so the HTTP app reads them without
importing the model presets' schema."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniflow.core.frozen import Frozen


class ServerConfig(Frozen):
    """`omniflow serve` settings."""

    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0: any free port).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of omniflow's loggers (and uvicorn's)."
    )
    max_input_chars: int = Field(4096, ge=1, description="Longest accepted `input` text.")
    max_concurrent_requests: int = Field(256, ge=1, description="Requests admitted at once.")
    max_buffered_audio_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="Audio a request may get ahead of its client (seconds); with that much "
        "unread, the request is paused (keeping its state) until the client reads. The same "
        "amount bounds each request's frame backlog between stages.",
    )
    max_first_audio_wait_s: float | None = Field(
        0.5,
        gt=0,
        allow_inf_nan=False,
        description="Admission by deadline: a speech request the pipeline could not seat "
        "within this many seconds (the requests queued ahead of it times the measured "
        "interval between seats freeing) is refused at once with a 503 JSON and Retry-After "
        "instead of waiting in the queue; null: requests queue until seated (the in-flight "
        "cap, max_concurrent_requests, still answers 429).",
    )
    stalled_client_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="A streamed response whose client takes nothing for this long is "
        "aborted, releasing its KV blocks and decoder slot.",
    )
    keep_alive_timeout_s: float = Field(
        75.0,
        gt=0,
        allow_inf_nan=False,
        description="How long an idle kept-alive connection stays open. Longer than the "
        "clients' own pool expiry (httpx: 5 s), so that the client, not the server, closes an "
        "idle connection: a server that closes one just as the client reuses it fails that "
        "request before its headers (uvicorn's default is 5 s).",
    )
    max_ref_audio_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="Longest voice-clone reference (`ref_audio`, seconds); longer is a 400. "
        "The reference is encoded whole on the CPU, once per request.",
    )
    max_ref_audio_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Largest voice-clone reference file (`ref_audio`, decoded bytes); larger "
        "is a 400 before it is decoded.",
    )
    max_voices: int = Field(
        64,
        ge=0,
        description="Voices a Base model's registry (POST /v1/audio/voices) holds; a "
        "registration past it is a 409 until one is deleted (0: none are kept).",
    )
