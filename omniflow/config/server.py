"""`omniflow serve`'s settings: a module of their own, so the HTTP app reads them without
importing the model presets' schema."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

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
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="A connection must send a whole request head (request line and headers) "
        "within this many seconds of opening, or of the first bytes of a later request on a "
        "kept-alive connection; past it the server closes it (with a 408 JSON if part of a "
        "head came). Waiting, it holds no turn of other connections.",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="A request body that stops arriving (nothing for this many seconds) is "
        "answered with a 408 JSON and the connection closed (a body that never ends would "
        "otherwise hold its connection for ever); a slow upload that keeps coming is not cut.",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request head (request line and headers, bytes); larger is a 431 "
        "JSON. Also h11's bound on a head still arriving (uvicorn's "
        "h11_max_incomplete_event_size).",
    )
    max_unheard_per_client: int = Field(
        32,
        ge=1,
        description="Connections one client address may hold open that have not sent a whole "
        "request head (idle or slow); when one more arrives, the oldest of them is closed.",
    )
    max_unheard_connections: int = Field(
        512,
        ge=1,
        description="The same bound over all clients: past it the oldest connection that has "
        "not sent a whole request head is closed.",
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1,
        description="Largest request body (bytes); larger is a 413 JSON as soon as its "
        "Content-Length shows it (a chunked body: once it passes the limit), and the rest is "
        "not read. A WebSocket message is bounded alike (closed with 1009). null: derived, "
        "the largest reference (max_ref_audio_bytes, base64) plus "
        "three text fields of max_input_chars at their longest JSON escapes plus 64 KiB.",
    )
    max_concurrent_references: int = Field(
        2,
        ge=1,
        description="Voice-clone references (a speech request's or a voice registration's "
        "ref_audio) decoded and encoded at once, each on a thread of its own; another at "
        "the same time is a 429 with Retry-After. A body large enough to carry one takes "
        "its place before it is read.",
    )
    warmup_frames: int | None = Field(
        None,
        ge=0,
        description="Frames of one request the server runs through the pipeline before it "
        "accepts connections, so that what is set up at first use is paid before `ready`, "
        "not by the first client. null: 16 on platform=cuda, 0 elsewhere and on Base models "
        "(whose requests need a reference); 0: none.",
    )
    ws_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="A WebSocket speech session (/v1/audio/speech/stream) that sends no "
        "message for this long while it has nothing queued or being spoken is closed, with an "
        "error event first; the place it held of max_concurrent_requests is freed.",
    )

    @model_validator(mode="after")
    def _unheard_bounds(self) -> ServerConfig:
        if self.max_unheard_per_client > self.max_unheard_connections:
            raise ValueError(
                f"server.max_unheard_per_client ({self.max_unheard_per_client}) is over "
                f"server.max_unheard_connections ({self.max_unheard_connections}), so it could "
                "never act; lower it or raise max_unheard_connections"
            )
        return self

    @property
    def body_limit(self) -> int:
        """`max_body_bytes`, or what the largest valid request needs: a reference of
        `max_ref_audio_bytes` in base64 (4 characters per 3 bytes) wrapped in lines of 76
        (an escaped CRLF, 4 bytes of JSON, after each: `ref_audio` may be wrapped) with its
        data-URI prefix, and `input`, `instructions` and `ref_text` of `max_input_chars`
        each, every character at its longest JSON escape (a surrogate pair, 12 bytes), plus
        64 KiB for the other fields."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        base64 = 4 * -(-self.max_ref_audio_bytes // 3)
        reference = base64 + 4 * -(-base64 // 76)
        return reference + 3 * 12 * self.max_input_chars + 64 * 1024
