"""`searchteam serve`: /ask, the OpenAI-compatible endpoints, shared batching, limits and 4xx/5xx cases,
with the scripted LLM double (control flow only)."""

from __future__ import annotations

import asyncio
import inspect
import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from searchteam.cli import app as cli_app
from searchteam.config import RunConfig
from searchteam.errors import LLMError
from searchteam.factory import Components
from searchteam.llm.base import GenerationRequest
from searchteam.llm.openai import OpenAIBackend
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.serve import ServeLimits, build_service, create_app
from tests.support.helpers import PASSAGES, TinyRetriever, send_partial, serve_on_loopback


def answer_from_passages(request: GenerationRequest) -> str:
    return "<answer>Paris</answer>" if "capital of France" in request.messages[-1]["content"] else "x"


def make_app(llm: ScriptedLLM | None = None, method: str = "naive_rag", limits: ServeLimits | None = None):
    llm = llm or ScriptedLLM(answer_from_passages)
    parts = Components(get_team(method), {"policy": llm}, TinyRetriever(PASSAGES))
    return create_app(build_service(RunConfig(method=method, batch_size=16), parts, limits))


def asgi_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve.test", timeout=30)


def test_ask_answers_with_trace_and_scores():
    reply = TestClient(make_app()).post(
        "/ask", json={"question": "What is the capital of France?", "golden_answers": ["Paris"]}
    )
    body = reply.json()
    assert reply.status_code == 200 and body["answer"] == "Paris" and body["error"] is None
    assert body["scores"] == {"em": 1.0, "cover_em": 1.0, "acc": 1.0, "f1": 1.0}
    assert [t["role"] for t in body["trace"]["turns"]] == ["answer"]
    passages = body["trace"]["searches"][0]["passages"]
    assert passages[0]["title"] == "Paris" and passages[0]["text"] == "Paris is the capital of France."
    assert (
        body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )


async def test_concurrent_requests_share_model_batches():
    llm = ScriptedLLM(answer_from_passages)
    app = make_app(llm)
    async with asgi_client(app) as client:
        questions = [f"What is the capital of France? ({i})" for i in range(12)]
        replies = await asyncio.gather(*(client.post("/ask", json={"question": q}) for q in questions))
        health = (await client.get("/health")).json()
    assert all(r.status_code == 200 and r.json()["answer"] == "Paris" for r in replies)
    assert sum(llm.batch_sizes) == 12 and max(llm.batch_sizes) > 1
    assert health["served"] == 12 and health["batching"]["policy"]["mean_batch"] > 1


def test_chat_completions_are_a_standard_chat_completion():
    body = {
        "model": "naive_rag",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Where is Paris?"},
            {"role": "assistant", "content": "In France."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
        ],
    }
    reply = TestClient(make_app()).post("/v1/chat/completions", json=body).json()
    assert reply["object"] == "chat.completion" and reply["model"] == "naive_rag"
    assert reply["id"].startswith("chatcmpl-") and isinstance(reply["created"], int)
    assert reply["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert reply["usage"]["prompt_tokens"] > 0 and reply["trace"]["turns"][0]["role"] == "answer"
    assert "What is the capital of France?" in reply["trace"]["searches"][0]["query"]


def test_an_openai_client_calls_the_team_as_a_model():
    """searchteam's own OpenAI-compatible backend, over real HTTP, uses the team as its model."""
    models = TestClient(make_app()).get("/v1/models").json()
    assert models == {
        "object": "list",
        "data": [{"id": "naive_rag", "object": "model", "created": 0, "owned_by": "searchteam"}],
    }
    with serve_on_loopback(make_app()) as base_url:
        client = OpenAIBackend("naive_rag", base_url, max_retries=0)
        [completion] = client.generate(
            [GenerationRequest([{"role": "user", "content": "capital of France?"}])]
        )
    assert completion.text == "Paris" and completion.prompt_tokens > 0


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "not JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"{}", 422, "'question' is missing"),
        (b'{"question": "  "}', 422, "non-empty string"),
        (b'{"question": 42}', 422, "non-empty string"),
        (b'{"question": "' + b"a" * 101 + b'"}', 413, "limit is 100"),
        (b'{"question": "q", "golden_answers": [1]}', 422, "list of strings"),
    ],
)
def test_ask_rejects_bad_input(body, status, message):
    app = make_app(limits=ServeLimits(max_question_chars=100))
    reply = TestClient(app).post("/ask", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status and message in reply.json()["detail"]


USER = [{"role": "user", "content": "capital of France?"}]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{oops", 400, "not JSON"),
        ({"messages": USER}, 400, "'model' is missing"),
        ({"model": "gpt-4o", "messages": USER}, 404, "'gpt-4o' does not exist"),
        ({"model": "naive_rag", "messages": []}, 400, "non-empty list"),
        ({"model": "naive_rag", "messages": "hi"}, 400, "non-empty list"),
        ({"model": "naive_rag", "messages": [{"role": "system", "content": "x"}]}, 400, "no user message"),
        ({"model": "naive_rag", "messages": [{"role": "user", "content": None}]}, 400, "no text"),
        ({"model": "naive_rag", "messages": [{"role": "user", "content": ""}]}, 422, "non-empty"),
        ({"model": "naive_rag", "messages": USER, "stream": "yes"}, 400, "'stream' must be true or false"),
        ({"model": "naive_rag", "messages": USER, "stream_options": {}}, 400, "only allowed when 'stream'"),
        ({"model": "naive_rag", "messages": USER, "n": 2}, 400, "only n=1"),
    ],
)
def test_chat_completions_reject_bad_input_in_openai_shape(body, status, message):
    client = TestClient(make_app())
    if isinstance(body, bytes):
        reply = client.post("/v1/chat/completions", content=body)
    else:
        reply = client.post("/v1/chat/completions", json=body)
    error = reply.json()["error"]
    assert reply.status_code == status and message in error["message"]
    assert error["type"] == "invalid_request_error"


async def test_a_full_server_answers_503_then_recovers():
    release = threading.Event()

    def slow(request: GenerationRequest) -> str:
        release.wait(10)
        return "<answer>Paris</answer>"

    app = make_app(ScriptedLLM(slow), limits=ServeLimits(max_pending=1))
    async with asgi_client(app) as client:
        first = asyncio.create_task(client.post("/ask", json={"question": "capital of France?"}))
        while (await client.get("/health")).json()["in_flight"] == 0:
            await asyncio.sleep(0.01)
        busy = await client.post("/ask", json={"question": "another?"})
        chat = await client.post("/v1/chat/completions", json={"model": "naive_rag", "messages": USER})
        release.set()
        assert (await first).json()["answer"] == "Paris"
    message = "server busy: 1 requests in flight (limit 1); retry after 1 s"
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1" and busy.json()["detail"] == message
    assert chat.status_code == 503 and chat.headers["retry-after"] == "1"
    assert chat.json()["error"] == {"message": message, "type": "server_error", "param": None, "code": None}


def test_backend_failure_is_503_and_a_team_error_is_reported():
    def dead(request: GenerationRequest) -> str:
        raise LLMError("model server unreachable")

    reply = TestClient(make_app(ScriptedLLM(dead))).post("/ask", json={"question": "q?"})
    assert reply.status_code == 503 and "model server unreachable" in reply.json()["detail"]

    def buggy(request: GenerationRequest) -> str:
        raise ValueError("team bug")

    client = TestClient(make_app(ScriptedLLM(buggy)))
    reply = client.post("/ask", json={"question": "q?"})
    assert reply.status_code == 200 and "team bug" in reply.json()["error"]
    chat = client.post("/v1/chat/completions", json={"model": "naive_rag", "messages": USER})
    assert chat.status_code == 500 and "team bug" in chat.json()["error"]["message"]
    assert chat.json()["error"]["type"] == "server_error"


def test_multi_role_team_runs_behind_the_server():
    """A team with several roles, searches and state snapshots (M-ASK) runs as one episode per request."""
    searches = iter(["<search>capital of France</search>"])
    script = {
        "plan": "<q1>Capital of France?</q1><a1>unknown</a1><predicted_answer>?</predicted_answer>",
        "summary": "<evidence>Paris is the capital of France.</evidence>",
        "update": "<Update>t1</Update>",
        "answer": "Paris</predicted_answer>",
    }
    llm = ScriptedLLM(lambda r: next(searches, "<end>") if r.role == "search" else script[r.role])
    reply = TestClient(make_app(llm, method="mask")).post("/ask", json={"question": "capital of France?"})
    body = reply.json()
    assert reply.status_code == 200 and body["answer"] == "Paris" and body["method"] == "mask"
    turns = body["trace"]["turns"]
    assert [t["role"] for t in turns] == ["plan", "search", "summary", "update", "search", "answer"]
    assert all(t["parsed_ok"] for t in turns) and body["trace"]["states"][-1]["predicted_answer"] == "Paris"


def test_cli_serve_names_an_unknown_method():
    result = CliRunner().invoke(cli_app, ["serve", "--method", "nope"])
    assert result.exit_code == 2 and "nope" in result.output


async def test_a_request_past_the_timeout_is_cancelled_with_504():
    release = threading.Event()

    def slow(request: GenerationRequest) -> str:
        release.wait(10)
        return "<answer>Paris</answer>"

    app = make_app(ScriptedLLM(slow), limits=ServeLimits(request_timeout_s=0.5))
    async with asgi_client(app) as client:
        ask = await client.post("/ask", json={"question": "capital of France?"})
        chat = await client.post("/v1/chat/completions", json={"model": "naive_rag", "messages": USER})
        release.set()
        again = await client.post("/ask", json={"question": "capital of France?"})
        health = (await client.get("/health")).json()
    message = "no answer within the server's 0.5 s request timeout"
    assert ask.status_code == 504 and ask.json()["detail"] == message
    assert chat.status_code == 504 and chat.json()["error"]["type"] == "server_error"
    assert again.status_code == 200 and again.json()["answer"] == "Paris"
    assert health["in_flight"] == 0 and health["request_timeout_s"] == 0.5


def test_an_oversize_body_is_413_in_the_shape_of_its_endpoint():
    client = TestClient(make_app(limits=ServeLimits(max_body_bytes=1000)))
    question = "capital of France? " * 100
    ask = client.post("/ask", json={"question": question})
    user = [{"role": "user", "content": question}]
    chat = client.post("/v1/chat/completions", json={"model": "naive_rag", "messages": user})
    assert ask.status_code == 413 and ask.json()["detail"].endswith("bytes; the limit is 1000")
    assert chat.status_code == 413 and chat.json()["error"]["type"] == "invalid_request_error"


def test_an_oversize_body_is_refused_before_it_is_read():
    with serve_on_loopback(make_app(limits=ServeLimits(max_body_bytes=1000))) as base_url:
        announced = {"Content-Type": "application/json", "Content-Length": "10000000"}
        status, headers, body = send_partial(base_url.removesuffix("/v1"), "/ask", announced, b'{"question')
    assert status == 413 and headers["connection"] == "close"
    assert body["detail"] == "the request body has 10000000 bytes; the limit is 1000"


def test_serve_flags_reach_the_servers_and_default_to_their_limits(monkeypatch: pytest.MonkeyPatch):
    import searchteam.retrieval as retrieval
    import searchteam.retrieval.server as retrieval_server
    import searchteam.serve as team_server
    from searchteam.cli.serving import serve, serve_retriever
    from searchteam.server_limits import RetrieverLimits

    for command, limits in [(serve, ServeLimits), (serve_retriever, RetrieverLimits)]:
        flags = inspect.signature(command).parameters
        defaults = (
            flags["max_pending"].default,
            flags["max_body_bytes"].default,
            flags["request_timeout"].default,
        )
        assert defaults == (limits.max_pending, limits.max_body_bytes, limits.request_timeout_s)

    seen: dict[str, object] = {}
    monkeypatch.setattr(retrieval, "build_retriever", lambda *args, **kwargs: TinyRetriever(PASSAGES))
    monkeypatch.setattr(retrieval_server, "serve", lambda retriever, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(team_server, "build_service", lambda config, limits: limits)
    monkeypatch.setattr(team_server, "serve", lambda limits, **kwargs: seen.update(team=limits))
    bounds = ["--max-pending", "3", "--max-body-bytes", "100", "--request-timeout", "2.5"]
    assert CliRunner().invoke(cli_app, ["serve-retriever", *bounds]).exit_code == 0
    assert CliRunner().invoke(cli_app, ["serve", "--method", "naive_rag", *bounds]).exit_code == 0
    assert {k: seen[k] for k in ("max_pending", "max_body_bytes", "request_timeout_s")} == {
        "max_pending": 3,
        "max_body_bytes": 100,
        "request_timeout_s": 2.5,
    }
    assert seen["team"] == ServeLimits(max_pending=3, max_body_bytes=100, request_timeout_s=2.5)


def test_a_short_soak_serves_every_request_without_an_error(tmp_path):
    """benchmarks/soak_serve.py for 15 s: 32 clients on every endpoint, plain and streamed, against the
    real app, server and retriever. Every request is answered; the server counted each."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "soak_serve.py"
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(script), "--seconds", "15", "--sample-seconds", "5", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == 0, figures["error_kinds"]
    assert figures["requests"] >= 4 * figures["clients"] and figures["served"] == figures["requests"]
