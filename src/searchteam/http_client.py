"""How searchteam's HTTP clients (a model server, a retriever server) wait: a connection is made within
`CONNECT_TIMEOUT_S`, an answer may take the caller's read timeout (a generation queued on the server
included), and waiting for a pooled connection is not timed, since each client bounds its own requests at
the pool's size. An idle connection is closed after `KEEPALIVE_EXPIRY_S`, before the server would close it
(uvicorn, which vLLM and searchteam's servers run on, after 5 s): a reused connection never races the
server's close."""

from __future__ import annotations

import httpx

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_EXPIRY_S = 2.0


def timeouts(read: float) -> httpx.Timeout:
    """`read` seconds for an answer (and to send the request), `CONNECT_TIMEOUT_S` to connect, no limit
    on the wait for a pooled connection."""
    return httpx.Timeout(read, connect=min(CONNECT_TIMEOUT_S, read), pool=None)


def limits(connections: int) -> httpx.Limits:
    """A pool of `connections`, all kept alive while busy, each closed after `KEEPALIVE_EXPIRY_S` idle."""
    return httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
