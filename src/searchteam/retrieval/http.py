"""Client for a Search-R1-compatible `POST /retrieve` server (ours, or Search-R1's own)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from searchteam.auth import API_KEY_ENV, api_key_from_env, auth_header
from searchteam.errors import RetrievalError
from searchteam.http_client import limits, timeouts
from searchteam.retrieval.corpus import split_contents
from searchteam.types import Passage

BACKOFF_SECONDS = 0.25


def endpoint(url: str) -> str:
    """`http://host:port`, `.../` or `.../retrieve` all mean the same endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/retrieve") else f"{url}/retrieve"


MAX_CONNECTIONS = 16  # searches of several threads at once (a run's batcher, a judge, ...)


class HTTPRetriever:
    """Retriever that asks a remote server; retries transport errors and 5xx with exponential backoff."""

    name = "http"

    def __init__(
        self,
        url: str,
        timeout: float = 30,
        max_retries: int = 3,
        max_batch: int = 256,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: the server's (`serve-retriever --api-key`); default: $SEARCHTEAM_API_KEY, if set."""
        self.url = endpoint(url)
        self.base_url = self.url.removesuffix("/retrieve")
        self.timeout, self.max_retries, self.max_batch = timeout, max_retries, max_batch
        headers = auth_header(api_key or api_key_from_env())
        pool = limits(MAX_CONNECTIONS)
        self._client = httpx.Client(timeout=timeouts(timeout), limits=pool, headers=headers)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-`k` passages per query; batches larger than `max_batch` go as several requests."""
        hits: list[list[Passage]] = []
        for start in range(0, len(queries), self.max_batch):
            chunk = queries[start : start + self.max_batch]
            body = {"queries": chunk, "topk": k, "return_scores": True}
            hits.extend(parse_result(self._post(body), len(chunk), self.url))
        return hits

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPRetriever:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _post(self, body: dict[str, Any]) -> Any:
        problem, hint = "", ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(BACKOFF_SECONDS * 2 ** (attempt - 1))
            try:
                response = self._client.post(self.url, json=body)
            except httpx.TimeoutException:
                problem, hint = f"no answer within {self.timeout}s", "it may be overloaded or stuck"
                continue
            except httpx.TransportError as exc:
                problem, hint = f"cannot connect ({type(exc).__name__}: {exc})", self._start_hint()
                continue
            if response.status_code >= 500:
                problem = f"server error HTTP {response.status_code}: {_detail(response)}"
                hint = "see the server's log"
                continue
            if response.status_code == 401:
                raise RetrievalError(
                    f"retriever at {self.url} wants an API key (HTTP 401): set {API_KEY_ENV} to the key it "
                    "was started with (serve-retriever --api-key)"
                )
            if response.status_code >= 400:
                raise RetrievalError(
                    f"retriever at {self.url} rejected the request (HTTP {response.status_code}): "
                    f"{_detail(response)}"
                )
            return _json(response, self.url)
        raise RetrievalError(
            f"retriever at {self.url} failed after {self.max_retries + 1} attempts: {problem}. {hint}"
        )

    def _start_hint(self) -> str:
        port = httpx.URL(self.base_url).port
        start = "searchteam serve-retriever" + (f" --port {port}" if port else "")
        return (
            f"Is `searchteam serve-retriever` running at {self.base_url}? Start it with `{start}`, "
            "or pass --retriever bm25 to search in-process"
        )


def parse_result(payload: Any, n_queries: int, url: str) -> list[list[Passage]]:
    """Passages from `{"result": [...]}`, scored (`{"document", "score"}`) or bare documents."""
    rows = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or len(rows) != n_queries:
        raise RetrievalError(f"retriever at {url} answered without a 'result' list of {n_queries} rankings")
    try:
        return [[_passage(item) for item in row] for row in rows]
    except (TypeError, KeyError, AttributeError) as exc:
        raise RetrievalError(f"retriever at {url} answered with a malformed document: {exc!r}") from None


def _passage(item: dict[str, Any]) -> Passage:
    doc, score = (item["document"], item.get("score")) if "document" in item else (item, None)
    if "text" in doc:
        title, text = doc.get("title") or "", doc["text"]
    else:
        title, text = split_contents(doc["contents"])
    return Passage(id=str(doc.get("id", "")), title=title, text=text, score=score)


def _json(response: httpx.Response, url: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise RetrievalError(f"retriever at {url} answered with non-JSON: {response.text[:200]!r}") from None


def _detail(response: httpx.Response) -> str:
    """The server's own error message (FastAPI's `detail`), else the start of the body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else response.text[:300]
