"""Test doubles shared by unit tests (control flow only; real-model tests live beside them)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from searchteam.types import Passage


@contextmanager
def serve_on_loopback(app) -> Iterator[str]:
    """Run an ASGI `app` with uvicorn on a free loopback port in a thread; gives its /v1 base url."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(5)


class TinyRetriever:
    """Keyword-overlap retriever over a handful of passages."""

    name = "tiny"

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        self.calls: list[list[str]] = []

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append(list(queries))
        out = []
        for q in queries:
            words = set(q.lower().split())
            ranked = sorted(self.passages, key=lambda p: -len(words & set(p.text.lower().split())))
            out.append(ranked[:k])
        return out


PASSAGES = [
    Passage(id="1", title="Thomas Mann", text="Thomas Mann was a German novelist."),
    Passage(id="2", title="David Guterson", text="David Guterson is an American novelist."),
    Passage(id="3", title="Paris", text="Paris is the capital of France."),
]


def send_partial(
    url: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], dict]:
    """POST `path` over a raw socket with `headers` and only `body` (less than the headers announce, so the
    body never ends), then read the reply until the server closes the connection: status, headers, JSON."""
    target = httpx.URL(url)
    head = "".join(f"{name}: {value}\r\n" for name, value in {"Host": target.host, **headers}.items())
    with socket.create_connection((target.host, target.port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    top, _, payload = reply.partition(b"\r\n\r\n")
    status_line, *lines = top.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), fields, json.loads(payload)


def assert_close_scaled(
    actual: Any, expected: Any, rel: float = 1e-5, *, scale: float | None = None, msg: str = ""
) -> None:
    """`actual` equals `expected` to within `rel` × `scale` everywhere (`scale`: max |expected| unless
    given), for two differently computed fp32 results of a model (chunked vs full projection, another batch
    shape, a recomputed pass). Their rounding differs by a few ulps of the largest magnitudes summed, in an
    order that depends on the CPU's kernels (BLAS, oneDNN, vector width, threads): an entry near zero of a
    gradient whose largest entry is 244 may move by 1e-4 (4e-7 of the scale) with nothing wrong, which no
    per-entry rtol allows. Reorderings stay near 1e-6 of the scale; a real bug (a wrong gradient, position
    or temperature) moves results by percents of it, so the default rel = 1e-5 separates the two."""
    import torch

    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if scale is None:
        scale = expected.abs().max().item() if expected.numel() else 0.0
    atol = rel * float(scale) + 1e-12  # the floor: an all-zero `expected` must be matched by zeros

    def message(default: str) -> str:
        where = f"{msg}: " if msg else ""
        return f"{where}{default}\n(tolerance {atol:.3g} = {rel:g} x scale {float(scale):.4g})"

    torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol, msg=message)


def error_line(result: Any) -> str:
    """The command's only stderr line, checked to be a one-line `error:` with exit status 2."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]
