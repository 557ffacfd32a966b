"""A Search-R1-compatible retrieval server: `POST /retrieve` and `GET /health` over any Retriever.

Request: `{"queries": [...], "topk": 3, "return_scores": false}`, or SkyRL's single-query
`{"query": "...", "topk": 3}`. Response: `{"result": [...]}` with one list per query (one list for a single
`query`) of `{"document": doc, "score": s}` (return_scores) or of bare docs, where a doc is
`{"id", "title", "text", "contents"}`. Requests that arrive while a search runs are merged into the next
retriever call, so many small concurrent requests become few batched searches.

Bounds (`searchteam.http_bounds`, shared with `searchteam serve`): a body over `max_body_bytes` is a 413
before it is read whole, a request that takes longer than `request_timeout_s` is a 504, and beyond
`max_pending` requests in flight the server answers 503 with `Retry-After` at once. uvicorn runs on uvloop
and httptools when they are installed (its `auto` choice), else on asyncio and h11.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from searchteam.auth import ApiKeyMiddleware, check_bind
from searchteam.errors import RetrievalError
from searchteam.http_bounds import BoundedApp, RequestGate, detail_body
from searchteam.retrieval.base import Retriever
from searchteam.server_limits import RetrieverLimits
from searchteam.types import Passage

log = logging.getLogger(__name__)

DEFAULT_TOPK = 3  # Search-R1's server default when a request has no topk


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    queries: list[str] | None = None
    query: str | None = None
    topk: int | None = None
    return_scores: bool = False


def check_request(req: RetrieveRequest, limits: RetrieverLimits) -> tuple[list[str], int]:
    """Raise an HTTPException (4xx, with a message) for a request the server will not run; return its
    queries (a single `query` as a list of one) and topk."""
    queries = _queries(req)
    if len(queries) > limits.max_queries:
        raise HTTPException(413, f"{len(queries)} queries; the limit is {limits.max_queries}")
    names = ["query"] if req.query is not None else [f"queries[{i}]" for i in range(len(queries))]
    for name, query in zip(names, queries, strict=True):
        if not query.strip():
            raise HTTPException(422, f"{name} is empty")
        if len(query) > limits.max_query_chars:
            raise HTTPException(
                413, f"{name} has {len(query)} characters; the limit is {limits.max_query_chars}"
            )
    topk = DEFAULT_TOPK if req.topk is None else req.topk
    if not 1 <= topk <= limits.max_k:
        raise HTTPException(422, f"'topk' must be between 1 and {limits.max_k}, got {topk}")
    return queries, topk


def _queries(req: RetrieveRequest) -> list[str]:
    if req.query is not None and req.queries is not None:
        raise HTTPException(422, "give either 'queries' (a list) or 'query' (one string), not both")
    if req.query is not None:
        return [req.query]
    if not req.queries:
        raise HTTPException(422, "'queries' must be a non-empty list of strings (or 'query' one string)")
    return req.queries


def document(p: Passage) -> dict[str, Any]:
    return {"id": p.id, "title": p.title, "text": p.text, "contents": p.contents}


def format_result(hits: list[list[Passage]], return_scores: bool) -> list[list[dict[str, Any]]]:
    if return_scores:
        return [[{"document": document(p), "score": p.score} for p in row] for row in hits]
    return [[document(p) for p in row] for row in hits]


@dataclass
class _Job:
    queries: list[str]
    k: int
    future: asyncio.Future[list[list[Passage]]]


@dataclass
class SearchBatcher:
    """Runs one retriever call at a time; jobs queued meanwhile go together into the next call.

    A batch asks for the largest k among its jobs and each job keeps its own top-k of that ranking. If the
    retriever raises, every job in that batch gets the error.
    """

    retriever: Retriever
    max_batch_queries: int = 512
    searches: int = 0  # retriever calls made
    requests: int = 0  # requests answered through them
    _pending: deque[_Job] = field(default_factory=deque)
    _worker: asyncio.Task[None] | None = None

    async def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        loop = asyncio.get_running_loop()
        job = _Job(queries, k, loop.create_future())
        self._pending.append(job)
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._drain())
        return await job.future

    async def _drain(self) -> None:
        while self._pending:
            batch = self._take_batch()
            if batch:
                await self._run(batch)

    def _take_batch(self) -> list[_Job]:
        """Waiting jobs up to `max_batch_queries` queries (at least one); jobs whose request timed out or
        went away (a cancelled future) are dropped, not searched."""
        batch: list[_Job] = []
        size = 0
        while self._pending:
            job = self._pending[0]
            if job.future.done():
                self._pending.popleft()
                continue
            if batch and size + len(job.queries) > self.max_batch_queries:
                break
            batch.append(self._pending.popleft())
            size += len(job.queries)
        return batch

    async def _run(self, batch: list[_Job]) -> None:
        queries = [q for job in batch for q in job.queries]
        self.searches += 1
        self.requests += len(batch)
        try:
            hits = await run_in_threadpool(self.retriever.search, queries, max(job.k for job in batch))
        except Exception as exc:
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        start = 0
        for job in batch:
            if not job.future.done():  # a client that went away cancels its future
                job.future.set_result([row[: job.k] for row in hits[start : start + len(job.queries)]])
            start += len(job.queries)


def create_app(
    retriever: Retriever,
    max_queries: int = RetrieverLimits.max_queries,
    max_k: int = RetrieverLimits.max_k,
    max_query_chars: int = RetrieverLimits.max_query_chars,
    max_body_bytes: int = RetrieverLimits.max_body_bytes,
    request_timeout_s: float = RetrieverLimits.request_timeout_s,
    max_pending: int = RetrieverLimits.max_pending,
    api_key: str | None = None,
) -> FastAPI:
    """The FastAPI app serving `retriever`; limits bound what one request may ask for and what the server
    holds at once; with `api_key`, every request but /health must carry it (`searchteam.auth`)."""
    limits = RetrieverLimits(
        max_queries, max_k, max_query_chars, max_body_bytes, request_timeout_s, max_pending
    )
    batcher = SearchBatcher(retriever, max_batch_queries=max(max_queries, 512))
    app = FastAPI(title="searchteam retriever", summary=f"{retriever.name} retrieval, Search-R1 compatible")
    app.add_exception_handler(RequestValidationError, _validation_error)
    gate = RequestGate(max_body_bytes, request_timeout_s, max_pending)
    app.add_middleware(BoundedApp, gate=gate, paths=["/retrieve"], error_body=detail_body)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)  # outermost: refused before they count

    @app.get("/health")
    async def health() -> dict[str, Any]:
        served = {"in_flight": gate.pending, "requests": batcher.requests, "searches": batcher.searches}
        return {"status": "ok", "retriever": retriever.name, **limits.__dict__, **served}

    @app.post("/retrieve")
    async def retrieve(req: RetrieveRequest) -> JSONResponse:
        queries, topk = check_request(req, limits)
        try:
            hits = await batcher.search(queries, topk)
        except RetrievalError as exc:
            raise HTTPException(503, f"retriever '{retriever.name}' failed: {exc}") from exc
        except Exception as exc:
            log.exception("retriever '%s' failed", retriever.name)
            detail = f"retriever '{retriever.name}' crashed: {type(exc).__name__}: {exc}"
            raise HTTPException(500, detail) from exc
        return JSONResponse({"result": format_result(hits, req.return_scores)})

    return app


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 for a malformed body, with the field errors joined into one readable message."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors]
    return JSONResponse({"detail": "invalid request: " + "; ".join(parts)}, status_code=422)


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    access_log: bool = True,
    api_key: str | None = None,
    allow_open: bool = False,
    **limits: Any,
) -> None:
    """Serve `retriever` with uvicorn until interrupted; `limits` go to `create_app`. uvicorn's `auto` loop
    and HTTP parser are uvloop and httptools where installed. Beyond the loopback interface it needs an
    `api_key` unless `allow_open`."""
    check_bind(host, api_key, allow_open)
    app = create_app(retriever, api_key=api_key, **limits)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log)
