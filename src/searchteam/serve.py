"""`searchteam serve`: one team behind HTTP, as a search module any OpenAI client can call.

    POST /ask                    {"question": "...", "golden_answers": [...]?} → answer, trace (and scores);
                                 with "stream": true, server-sent events: one `turn` per LLM call as it
                                 finishes, then `answer` (the reply above)
    POST /v1/chat/completions    OpenAI chat request whose `model` is the method; the last user message is
                                 the question; the answer is the assistant message, the trace rides along;
                                 with "stream": true, `chat.completion.chunk` events and `data: [DONE]`
    GET  /v1/models              the one model (= method) served
    GET  /health                 status, requests in flight, batching so far

Each request becomes one episode on the server's event loop, over backends shared by all requests: the
runtime's batchers gather the LLM and retrieval calls of concurrent episodes into shared model batches, as
in an eval run. Bounds (`ServeLimits`): `concurrency` episodes run at once; beyond `max_pending` requests
in flight the server answers 503 with `Retry-After`; a body over `max_body_bytes` or a question over
`max_question_chars` is a 413; a request not answered within `request_timeout_s` is cancelled with a 504
(a stream past it ends with an `error` event). A streaming client that goes away cancels its episode.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from searchteam.auth import ApiKeyMiddleware, check_bind
from searchteam.config import RunConfig
from searchteam.eval.summary import episode_trace
from searchteam.factory import Components, build_components, build_sampling
from searchteam.http_bounds import BoundedApp, RequestGate
from searchteam.metrics import answer_scores
from searchteam.runtime import Backends, Sampling, make_backends
from searchteam.runtime.context import TurnHook
from searchteam.runtime.runner import INFRASTRUCTURE_ERRORS, run_episode
from searchteam.runtime.turns import TurnFeed
from searchteam.teams import Team
from searchteam.types import Episode, Question


@dataclass(frozen=True)
class ServeLimits:
    concurrency: int = 64
    max_pending: int = 256
    max_question_chars: int = 4000
    max_body_bytes: int = 2**20  # a chat request carries the whole conversation, of which one turn is used
    request_timeout_s: float = 300.0  # an episode of several model calls, queued behind `concurrency` others

    def gate(self) -> RequestGate:
        return RequestGate(self.max_body_bytes, self.request_timeout_s, self.max_pending)


class TeamService:
    """A team on long-lived batching backends; `answer` runs one episode, many of them concurrently."""

    def __init__(
        self,
        team: Team,
        method: str,
        model: str,
        backends: Backends,
        sampling: Sampling,
        limits: ServeLimits | None = None,
    ) -> None:
        self.team, self.method, self.model = team, method, model
        self.backends, self.sampling, self.limits = backends, sampling, limits or ServeLimits()
        self.served = 0
        self.cancelled = 0  # episodes stopped before their end: the client went away, or the time ran out
        self._ids = itertools.count(1)
        self._slots: asyncio.Semaphore | None = None

    async def answer(
        self, question: str, golden_answers: list[str] | None = None, on_turn: TurnHook | None = None
    ) -> Episode:
        """Run the team on one question; a team bug is recorded on the episode, a dead backend raises.
        `on_turn` is told of each turn as it finishes."""
        try:
            async with self._semaphore():
                return await self._episode(question, golden_answers or [], on_turn)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.served += 1

    async def _episode(self, question: str, golden_answers: list[str], on_turn: TurnHook | None) -> Episode:
        q = Question(id=f"req-{next(self._ids)}", question=question, golden_answers=golden_answers)
        return await run_episode(
            self.team.solve, self.method, q, self.backends, self.sampling, self.model, on_turn=on_turn
        )

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.concurrency)
        return self._slots

    def batching(self) -> dict[str, dict[str, float]]:
        """Per backend: calls so far, their mean batch size (> 1 when requests shared batches) and the most
        under way at once."""
        batchers = {
            **self.backends.llms,
            **({"search": self.backends.search} if self.backends.search else {}),
        }
        return {
            name: {
                "batches": b.stats.batches,
                "items": b.stats.items,
                "mean_batch": round(b.stats.mean_batch, 2),
                "peak_in_flight": b.stats.peak_in_flight,
            }
            for name, b in batchers.items()
        }

    async def aclose(self) -> None:
        for batcher in [*self.backends.llms.values(), self.backends.search]:
            if batcher is not None:
                await batcher.aclose()


def build_service(
    config: RunConfig, components: Components | None = None, limits: ServeLimits | None = None
) -> TeamService:
    """The service for `config`: its team, model(s) and retriever (loaded unless `components` are given)."""
    components = components or build_components(config)
    backends = make_backends(components.llms, components.retriever, max_batch=config.batch_size)
    limits = limits or ServeLimits(concurrency=config.concurrency)
    return TeamService(components.team, config.method, config.model, backends, build_sampling(config), limits)


async def episode_stream(
    service: TeamService, question: str, golds: list[str], request: Request | None = None
) -> AsyncIterator[dict[str, Any] | Episode]:
    """Each turn's event as the turn finishes, then the episode (a dead backend raises).

    The episode runs as its own task, cancelled when the consumer stops early (its generator is closed
    or cancelled) or, given `request`, as soon as the client disconnects; then the stream just ends."""
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    task = asyncio.create_task(service.answer(question, golds, on_turn=TurnFeed(events.put_nowait)))
    task.add_done_callback(lambda _: events.put_nowait(None))
    watcher = asyncio.create_task(_cancel_on_disconnect(request, task)) if request else None
    try:
        while (event := await events.get()) is not None:
            yield event
        if not task.cancelled():
            yield task.result()
    finally:
        task.cancel()
        if watcher:
            watcher.cancel()


async def _cancel_on_disconnect(request: Request, task: asyncio.Task[Episode]) -> None:
    """Cancel `task` when the client of `request` goes away (its body is read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()


def sse(data: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event: an optional `event:` line and the JSON data."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may hold events back
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


def usage(episode: Episode) -> dict[str, int]:
    return {
        "prompt_tokens": episode.prompt_tokens,
        "completion_tokens": episode.completion_tokens,
        "total_tokens": episode.prompt_tokens + episode.completion_tokens,
    }


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


WORK_PATHS = ("/ask", "/v1/chat/completions")


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """A bounds error (413, 503, 504) in the shape of its endpoint: OpenAI's under /v1, else FastAPI's."""
    return OpenAIError(status, message).body() if path.startswith("/v1/") else {"detail": message}


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
    gate = service.limits.gate()
    app.add_middleware(BoundedApp, gate=gate, paths=WORK_PATHS, error_body=error_body)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)  # outermost: refused before they count

    @app.get("/health")
    async def health() -> dict[str, Any]:
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
        body = await _json_object(request, HTTPException)
        question = _question(body.get("question"), "question", service.limits, HTTPException)
        golds = _golden_answers(body.get("golden_answers"))
        if _flag(body, "stream", HTTPException):
            return event_stream(_ask_events(service, question, golds, request))
        episode = await _answer(service, question, golds, HTTPException)
        return ask_reply(service, question, golds, episode)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": service.method, "object": "model", "created": 0, "owned_by": "searchteam"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> dict[str, Any] | StreamingResponse:
        body = await _json_object(request, OpenAIError)
        _check_chat_request(body, service.method)
        question = _question(_last_user_message(body["messages"]), "messages", service.limits, OpenAIError)
        if _flag(body, "stream", OpenAIError):
            include_usage = _flag(body.get("stream_options") or {}, "include_usage", OpenAIError)
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


async def _openai_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return exc.response()


def _fail(kind: type[Exception], status: int, message: str, param: str | None = None) -> Exception:
    """An HTTPException (for /ask) or an OpenAIError (for /v1) with this status and message."""
    return OpenAIError(status, message, param) if kind is OpenAIError else HTTPException(status, message)


async def _json_object(request: Request, kind: type[Exception]) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _fail(kind, 400, "the request body is not JSON: send a JSON object") from None
    if not isinstance(body, dict):
        raise _fail(kind, 400, f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _question(value: Any, param: str, limits: ServeLimits, kind: type[Exception]) -> str:
    if value is None:
        raise _fail(kind, 422, f'\'{param}\' is missing: send {{"question": "..."}}', param)
    if not isinstance(value, str) or not value.strip():
        raise _fail(kind, 422, "the question must be a non-empty string", param)
    if len(value) > limits.max_question_chars:
        message = f"the question has {len(value)} characters; the limit is {limits.max_question_chars}"
        raise _fail(kind, 413, message, param)
    return value.strip()


def _flag(body: dict[str, Any], name: str, kind: type[Exception]) -> bool:
    value = body.get(name, False)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise _fail(kind, 400 if kind is OpenAIError else 422, f"'{name}' must be true or false", name)


def _golden_answers(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HTTPException(422, "'golden_answers' must be a list of strings")
    return value


def _check_chat_request(body: dict[str, Any], method: str) -> None:
    model = body.get("model")
    if model is None:
        raise OpenAIError(400, f"'model' is missing: this server serves the method '{method}'", "model")
    if model != method:
        message = f"the model '{model}' does not exist: this server serves the method '{method}'"
        raise OpenAIError(404, message, "model", "model_not_found")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError(400, "'stream_options' must be an object", "stream_options")
    if options is not None and not body.get("stream"):
        message = "'stream_options' is only allowed when 'stream' is true"
        raise OpenAIError(400, message, "stream_options")
    if body.get("n") not in (None, 1):
        raise OpenAIError(400, "only n=1 is supported: a team gives one answer per question", "n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise OpenAIError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")


def _last_user_message(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message (a string, or the text parts of a content list)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
                return "".join(str(p.get("text", "")) for p in parts)
            if not isinstance(content, str):
                raise OpenAIError(400, "the last user message has no text 'content'", "messages")
            return content
    raise OpenAIError(
        400, "'messages' has no user message: the last user message is the question", "messages"
    )


async def _answer(service: TeamService, question: str, golds: list[str], kind: type[Exception]) -> Episode:
    try:
        return await service.answer(question, golds)
    except INFRASTRUCTURE_ERRORS as exc:
        raise _fail(kind, 503, _backend_failed(service, exc)) from None


def _backend_failed(service: TeamService, exc: Exception) -> str:
    return f"the {service.method} team's backend failed: {exc}"


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
    loopback interface it needs an `api_key` unless `allow_open`."""
    import uvicorn

    check_bind(host, api_key, allow_open)
    uvicorn.run(create_app(service, api_key), host=host, port=port, log_level="info")
