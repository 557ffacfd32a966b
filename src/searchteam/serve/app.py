"""The HTTP app over a `TeamService`: /ask, /v1/chat/completions and their event streams, /v1/models,
/health; `serve` runs it with uvicorn."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from searchteam.auth import ApiKeyMiddleware, check_bind
from searchteam.errors import TeamBug
from searchteam.eval.summary import episode_trace
from searchteam.http_bounds import BoundedApp, RequestGate
from searchteam.metrics import answer_scores
from searchteam.runtime.runner import INFRASTRUCTURE_ERRORS
from searchteam.serve.requests import (
    WORK_PATHS,
    OpenAIError,
    check_chat_request,
    error_body,
    fail,
    flag,
    golden_answers,
    json_object,
    last_user_message,
    question_text,
)
from searchteam.serve.service import TeamService, episode_stream, usage
from searchteam.types import Episode


def sse(data: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event: an optional `event:` line and the JSON data."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may hold events back
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


def create_app(service: TeamService, api_key: str | None = None) -> FastAPI:
    """The HTTP front of `service`; the batchers are closed when the server shuts down. With `api_key`,
    every request but /health must carry it (`searchteam.auth`)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await service.aclose()

    app = FastAPI(
        title="searchteam", summary=f"the {service.method} team as a search module", lifespan=lifespan
    )
    app.add_exception_handler(OpenAIError, _openai_error)
    limits = service.limits
    gate = RequestGate(limits.max_body_bytes, limits.request_timeout_s, limits.max_pending)
    app.add_middleware(BoundedApp, gate=gate, paths=WORK_PATHS, error_body=error_body)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)  # outermost: refused before they count

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any] | JSONResponse:
        if service.broken:
            broken = {"status": "broken", "method": service.method, "error": _team_bug(service.broken)}
            return JSONResponse(broken, status_code=503)
        return {
            "status": "ok",
            "method": service.method,
            "model": service.model,
            "in_flight": gate.pending,
            "served": service.served,
            "cancelled": service.cancelled,
            "batching": service.batching(),
            **service.limits.__dict__,
        }

    @app.post("/ask", response_model=None)
    async def ask(request: Request) -> dict[str, Any] | StreamingResponse:
        body = await json_object(request, HTTPException)
        question = question_text(body.get("question"), "question", service.limits, HTTPException)
        golds = golden_answers(body.get("golden_answers"))
        if flag(body, "stream", HTTPException):
            return event_stream(_ask_events(service, question, golds, request))
        episode = await _answer(service, question, golds, HTTPException)
        return ask_reply(service, question, golds, episode)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": service.method, "object": "model", "created": 0, "owned_by": "searchteam"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> dict[str, Any] | StreamingResponse:
        body = await json_object(request, OpenAIError)
        check_chat_request(body, service.method)
        question = question_text(last_user_message(body["messages"]), "messages", service.limits, OpenAIError)
        if flag(body, "stream", OpenAIError):
            include_usage = flag(body.get("stream_options") or {}, "include_usage", OpenAIError)
            return event_stream(_chat_chunks(service, question, include_usage, request))
        episode = await _answer(service, question, [], OpenAIError)
        if episode.error:
            raise OpenAIError(500, _team_failed(service, episode))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": service.method,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": episode.answer},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": usage(episode),
            "trace": episode_trace(episode, passages=True),
        }

    return app


def ask_reply(service: TeamService, question: str, golds: list[str], episode: Episode) -> dict[str, Any]:
    """What /ask answers (and its stream's last event): the answer, costs, trace, and scores given golds."""
    reply: dict[str, Any] = {
        "answer": episode.answer,
        "method": service.method,
        "model": service.model,
        "question": question,
        "error": episode.error,
        "seconds": round(episode.seconds, 3),
        "usage": usage(episode),
        "trace": episode_trace(episode, passages=True),
    }
    if golds:
        reply["scores"] = answer_scores(episode.answer, golds)
    return reply


async def _ask_events(
    service: TeamService, question: str, golds: list[str], request: Request
) -> AsyncIterator[str]:
    """/ask as server-sent events: `turn` per finished turn, then `answer`, or `error` if a backend died.
    A comment opens the stream at once, so the client knows it was accepted before the first turn ends."""
    yield ": the episode has started\n\n"
    try:
        async for item in episode_stream(service, question, golds, request):
            if isinstance(item, Episode):
                yield sse(ask_reply(service, question, golds, item), "answer")
            else:
                yield sse(item, "turn")
    except INFRASTRUCTURE_ERRORS as exc:
        yield sse({"detail": _backend_failed(service, exc)}, "error")
    except TeamBug as bug:
        yield sse({"detail": _team_bug(bug)}, "error")


async def _chat_chunks(
    service: TeamService, question: str, include_usage: bool, request: Request
) -> AsyncIterator[str]:
    """A chat completion as OpenAI streams one: a chunk with the role, one per finished turn (an empty
    delta, the turn under the extra field `turn`), one with the answer, one with `finish_reason`, the usage
    chunk if asked for, then `[DONE]`. A failure ends the stream with an `error` event (OpenAI's shape)."""
    head: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": service.method,
    } | ({"usage": None} if include_usage else {})

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**head, "choices": [choice], **extra})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for item in episode_stream(service, question, [], request):
            if not isinstance(item, Episode):
                yield chunk({}, turn=item)
            elif item.error:
                yield sse(OpenAIError(500, _team_failed(service, item)).body(), "error")
            else:
                yield chunk({"content": item.answer})
                yield chunk({}, "stop", trace=episode_trace(item, passages=True))
                if include_usage:
                    yield sse({**head, "choices": [], "usage": usage(item)})
                yield SSE_DONE
    except INFRASTRUCTURE_ERRORS as exc:
        yield sse(OpenAIError(503, _backend_failed(service, exc)).body(), "error")
    except TeamBug as bug:
        yield sse(OpenAIError(500, _team_bug(bug)).body(), "error")


async def _openai_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return exc.response()


async def _answer(service: TeamService, question: str, golds: list[str], kind: type[Exception]) -> Episode:
    try:
        return await service.answer(question, golds)
    except INFRASTRUCTURE_ERRORS as exc:
        raise fail(kind, 503, _backend_failed(service, exc)) from None
    except TeamBug as bug:
        raise fail(kind, 500, _team_bug(bug)) from None


def _backend_failed(service: TeamService, exc: Exception) -> str:
    return f"the {service.method} team's backend failed: {exc}"


def _team_bug(bug: TeamBug) -> str:
    """The bug without its traceback, which the server's log shows as it stops."""
    return f"{bug.headline} The server stops."


def _team_failed(service: TeamService, episode: Episode) -> str:
    return f"the {service.method} team failed on this question: {episode.error}"


def serve(
    service: TeamService,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    allow_open: bool = False,
) -> None:
    """Serve `service` with uvicorn until interrupted (on uvloop and httptools where installed). Beyond the
    loopback interface it needs an `api_key` unless `allow_open`. A team bug that repeats stops the server
    (requests in flight finish) and is raised here, with its traceback."""
    import uvicorn

    check_bind(host, api_key, allow_open)
    config = uvicorn.Config(create_app(service, api_key), host=host, port=port, log_level="info")
    server = uvicorn.Server(config)
    service.on_broken = lambda _: setattr(server, "should_exit", True)
    server.run()
    if service.broken:
        raise service.broken
