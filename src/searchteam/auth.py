"""An API key for searchteam's servers (`serve`, `serve-retriever`), as vLLM's `--api-key` does it.

Clients send `Authorization: Bearer KEY`; the server compares it in constant time and answers 401 otherwise.
`/health` stays open, so load balancers and `searchteam` itself can see that a server is up. A server bound
beyond the loopback interface without a key would answer anyone on the network: that is refused unless
explicitly allowed.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os

from searchteam.errors import OpenServerRefused

API_KEY_ENV = "SEARCHTEAM_API_KEY"  # the key servers require and searchteam's clients send
OPEN_PATHS = frozenset({"/health"})


def api_key_from_env() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


def auth_header(api_key: str | None) -> dict[str, str]:
    """What a client sends: the Bearer header of `api_key`, none without one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_bind(host: str, api_key: str | None, allow_open: bool) -> None:
    """Refuse to serve on `host` beyond the loopback interface without a key, unless `allow_open`."""
    if api_key or allow_open or is_loopback(host):
        return
    raise OpenServerRefused(
        f"serving on {host} without an API key would answer anyone who reaches this machine: pass "
        f"--api-key KEY (or set {API_KEY_ENV}) and send it from the clients, bind --host 127.0.0.1, or pass "
        "--allow-no-api-key on a network you trust"
    )


class ApiKeyMiddleware:
    """ASGI middleware: every HTTP request but `OPEN_PATHS` must carry `Authorization: Bearer <api_key>`."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "missing or wrong API key: send the header Authorization: Bearer KEY"})
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})

    def _authorized(self, scope) -> bool:
        sent = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(sent, self.expected)
