"""The response header naming the replica that served a request (`x-omniflow-replica`).

A plain ASGI middleware: it adds one header to each response's start message and passes
every body message through as sent, so streamed responses (pcm, wav, mp3, SSE) stay
streamed."""

from __future__ import annotations

from typing import Any

REPLICA_HEADER = "x-omniflow-replica"


class ReplicaHeader:
    """Adds `x-omniflow-replica: NAME` to every HTTP response of `app`."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.value = name.encode("latin-1")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((REPLICA_HEADER.encode(), self.value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, tagged)
