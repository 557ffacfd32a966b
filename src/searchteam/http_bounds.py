"""Bounds on an HTTP server's requests, shared by `searchteam serve-retriever` and `searchteam serve`: body
size (413), time (504) and requests in flight (503 with `Retry-After`), as ASGI middleware."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

RETRY_AFTER_S = 1  # what a 503 for a full server tells the client to wait before trying again


@dataclass
class RequestGate:
    """A server's bounds on one request (body size, time) and on requests in flight, with their count."""

    max_body_bytes: int
    request_timeout_s: float
    max_pending: int
    pending: int = 0


ErrorBody = Callable[[str, int, str], dict[str, Any]]


def detail_body(path: str, status: int, message: str) -> dict[str, Any]:
    """FastAPI's error shape, `{"detail": message}`."""
    return {"detail": message}


class BoundedApp:
    """ASGI middleware bounding the requests to `paths` (the endpoints that do work; `/health` stays free)
    by `gate`.

    - More than `max_pending` requests in flight: 503 with `Retry-After`, before the body is read.
    - A body longer than `max_body_bytes`: 413, from its Content-Length before reading it, or as soon as a
      chunked body passes the limit; the connection is closed so the rest is never read.
    - A request not answered within `request_timeout_s` (its body read included): its work is cancelled and
      it gets a 504; a server-sent event stream already under way ends with an `error` event instead.

    The body is read here and handed on whole, so the app behind never sees more than the limit.
    """

    def __init__(
        self, app: ASGIApp, gate: RequestGate, paths: Collection[str], error_body: ErrorBody
    ) -> None:
        self.app, self.gate, self.paths, self.error_body = app, gate, frozenset(paths), error_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        gate = self.gate
        if gate.pending >= gate.max_pending:
            message = f"server busy: {gate.pending} requests in flight (limit {gate.max_pending})"
            headers = {"retry-after": str(RETRY_AFTER_S)}
            await self._reply(scope, send, 503, f"{message}; retry after {RETRY_AFTER_S} s", headers)
            return
        gate.pending += 1
        try:
            await self._within_time(scope, receive, send)
        finally:
            gate.pending -= 1

    async def _within_time(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = streaming = False

        async def tracked(message: Message) -> None:
            nonlocal started, streaming
            if message["type"] == "http.response.start":
                started = True
                streaming = (b"content-type", b"text/event-stream") in [
                    (name.lower(), value.split(b";")[0].strip()) for name, value in message["headers"]
                ]
            await send(message)

        deadline = asyncio.timeout(self.gate.request_timeout_s)
        try:
            async with deadline:
                body = await self._read_body(scope, receive, send)
                if body is not None:
                    await self.app(scope, _replay(body, receive), tracked)
        except TimeoutError:
            if not deadline.expired() or (started and not streaming):
                raise  # not ours, or the answer has begun: the connection is closed mid-response
            limit = self.gate.request_timeout_s
            message = f"no answer within the server's {limit:g} s request timeout"
            if not started:
                await self._reply(scope, send, 504, message)
                return
            event = f"event: error\ndata: {json.dumps(self.error_body(scope['path'], 504, message))}\n\n"
            await send({"type": "http.response.body", "body": event.encode(), "more_body": False})

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once a 413 was sent (or the client went away)."""
        limit = self.gate.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._too_large(scope, send, f"the request body has {declared} bytes; the limit is {limit}")
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(scope, send, f"the request body is over the limit of {limit} bytes")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, scope: Scope, send: Send, message: str) -> None:
        await self._reply(scope, send, 413, message, {"connection": "close"})

    async def _reply(
        self, scope: Scope, send: Send, status: int, message: str, headers: dict[str, str] | None = None
    ) -> None:
        response = JSONResponse(self.error_body(scope["path"], status, message), status, headers)
        await response(scope, _no_body, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body already read as one message, then whatever the client sends."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
