"""`searchteam serve` streaming: OpenAI chat chunks with the official `openai` client, the turn-by-turn
/ask stream, a client that goes away (its episode is cancelled) and `searchteam ask --stream`, with the
scripted LLM double (control flow only) over real HTTP (uvicorn on loopback)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from typer.testing import CliRunner

from searchteam.cli import app as cli_app
from searchteam.config import RunConfig
from searchteam.errors import LLMError
from searchteam.factory import Components
from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.serve import ServeLimits, build_service, create_app
from tests.support.helpers import PASSAGES, TinyRetriever, serve_on_loopback

QUESTION = "What is the capital of France?"
USER = [{"role": "user", "content": QUESTION}]
MASK_ROLES = ["plan", "search", "summary", "update", "search", "answer"]


def answer_from_passages(request: GenerationRequest) -> str:
    return "<answer>Paris</answer>" if "capital of France" in request.messages[-1]["content"] else "x"


class MaskScript:
    """M-ASK's roles scripted (plan, search, summary, update, search, answer); the first call of `hold`
    waits until the test sets `release`, and records whether it was released (not timed out)."""

    def __init__(self, hold: str | None = None, fail: str | None = None) -> None:
        self.hold, self.fail = hold, fail
        self.release = threading.Event()
        self.released: list[bool] = []
        self.searched = False

    def __call__(self, request: GenerationRequest) -> str:
        if request.role == self.hold and not self.released:
            self.released.append(self.release.wait(10))
        if request.role == self.fail:
            raise LLMError("model server unreachable")
        if request.role == "search":
            first, self.searched = not self.searched, True
            return "<search>capital of France</search>" if first else "<end>"
        return {
            "plan": "<q1>Capital of France?</q1><a1>unknown</a1><predicted_answer>?</predicted_answer>",
            "summary": "<evidence>Paris is the capital of France.</evidence>",
            "update": "<Update>t1</Update>",
            "answer": "Paris</predicted_answer>",
        }[request.role]


def make_app(llm: ScriptedLLM, method: str = "naive_rag", limits: ServeLimits | None = None):
    parts = Components(get_team(method), {"policy": llm}, TinyRetriever(PASSAGES))
    return create_app(build_service(RunConfig(method=method, batch_size=16), parts, limits))


def openai_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    """(event name, data) of each server-sent event in `lines`."""
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").strip())
        elif not line and data:
            yield name, "\n".join(data)
            name, data = None, []


def ask_stream(base_url: str, client: httpx.Client, **body: object):
    root = base_url.removesuffix("/v1")
    return client.stream("POST", f"{root}/ask", json={"question": QUESTION, "stream": True, **body})


def health(base_url: str) -> dict:
    return httpx.get(f"{base_url.removesuffix('/v1')}/health").json()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_the_openai_client_lists_the_model_and_completes():
    with serve_on_loopback(make_app(ScriptedLLM(answer_from_passages))) as base_url:
        client = openai_client(base_url)
        models = [m.id for m in client.models.list()]
        completion = client.chat.completions.create(model="naive_rag", messages=USER)
    assert models == ["naive_rag"]
    assert completion.object == "chat.completion" and completion.choices[0].message.content == "Paris"
    assert completion.choices[0].finish_reason == "stop" and completion.usage.total_tokens > 0


def test_a_streamed_completion_reassembles_to_the_plain_one():
    with serve_on_loopback(make_app(ScriptedLLM(MaskScript()), method="mask")) as base_url:
        client = openai_client(base_url)
        chunks = list(
            client.chat.completions.create(
                model="mask", messages=USER, stream=True, stream_options={"include_usage": True}
            )
        )
    with serve_on_loopback(make_app(ScriptedLLM(MaskScript()), method="mask")) as base_url:
        plain = openai_client(base_url).chat.completions.create(model="mask", messages=USER)

    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert all(c.model == "mask" for c in chunks)
    first, *rest, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].finish_reason is None
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == plain.choices[0].message.content == "Paris"
    assert [c.choices[0].finish_reason for c in rest] == [None] * (len(rest) - 1) + ["stop"]
    turns = [c.turn for c in rest if getattr(c, "turn", None)]
    assert [t["role"] for t in turns] == MASK_ROLES == [t["role"] for t in plain.trace["turns"]]
    assert usage.choices == [] and usage.usage == plain.usage


def test_a_stream_is_chunks_then_done():
    with serve_on_loopback(make_app(ScriptedLLM(answer_from_passages))) as base_url:
        body = {"model": "naive_rag", "messages": USER, "stream": True}
        with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=30) as reply:
            media_type = reply.headers["content-type"]
            events = list(sse_events(reply.iter_lines()))
    assert reply.status_code == 200 and media_type.startswith("text/event-stream")
    *chunks, (_, done) = events
    assert done == "[DONE]"
    assert [json.loads(data)["object"] for _, data in chunks] == ["chat.completion.chunk"] * len(chunks)
    deltas = [json.loads(data)["choices"][0]["delta"] for _, data in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""} and {"content": "Paris"} in deltas


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_model_is_refused_before_any_stream(stream: bool):
    llm = ScriptedLLM(answer_from_passages)
    with serve_on_loopback(make_app(llm)) as base_url, pytest.raises(openai.NotFoundError) as refused:
        openai_client(base_url).chat.completions.create(model="gpt-4o", messages=USER, stream=stream)
    assert refused.value.status_code == 404 and refused.value.code == "model_not_found"
    assert "'gpt-4o' does not exist" in refused.value.message and llm.requests == []


def test_ask_streams_each_turn_as_it_finishes_then_the_answer():
    """The answerer's call waits until the client holds the first turn: only a stream sent as the
    turns finish (not buffered until the end) lets it go on."""
    script = MaskScript(hold="answer")
    with serve_on_loopback(make_app(ScriptedLLM(script), method="mask")) as base_url:
        events = []
        with httpx.Client(timeout=30) as client, ask_stream(base_url, client, golden_answers=["Paris"]) as r:
            for name, data in sse_events(r.iter_lines()):
                events.append((name, json.loads(data)))
                script.release.set()
    *turns, (last, answer) = events
    assert script.released == [True]
    assert [name for name, _ in turns] == ["turn"] * len(MASK_ROLES) and last == "answer"
    assert [t["index"] for _, t in turns] == list(range(len(MASK_ROLES)))
    assert [t["role"] for _, t in turns] == MASK_ROLES
    summary = turns[2][1]
    assert summary["searches"][0]["query"] == "capital of France"
    assert summary["searches"][0]["titles"][0] == "Paris" and turns[0][1]["searches"] == []
    assert answer["answer"] == "Paris" and answer["scores"]["em"] == 1.0 and answer["error"] is None
    assert [t["role"] for t in answer["trace"]["turns"]] == MASK_ROLES


def test_a_bad_stream_flag_is_refused():
    with serve_on_loopback(make_app(ScriptedLLM(answer_from_passages))) as base_url:
        body = {"question": QUESTION, "stream": "yes"}
        reply = httpx.post(f"{base_url.removesuffix('/v1')}/ask", json=body, timeout=30)
    assert reply.status_code == 422 and "'stream' must be true or false" in reply.json()["detail"]


def test_ask_disconnecting_mid_stream_cancels_the_episode():
    script = MaskScript(hold="search")
    llm = ScriptedLLM(script)
    with serve_on_loopback(make_app(llm, method="mask")) as base_url:
        with httpx.Client(timeout=30) as client, ask_stream(base_url, client) as reply:
            name, data = next(sse_events(reply.iter_lines()))
        assert name == "turn" and json.loads(data)["role"] == "plan"  # the searcher's call is waiting
        assert_cancelled_and_stopped(base_url, script, llm)


def test_chat_disconnecting_mid_stream_cancels_the_episode():
    script = MaskScript(hold="search")
    llm = ScriptedLLM(script)
    with serve_on_loopback(make_app(llm, method="mask")) as base_url:
        stream = openai_client(base_url).chat.completions.create(model="mask", messages=USER, stream=True)
        role, plan = next(stream), next(stream)
        stream.close()
        assert role.choices[0].delta.role == "assistant" and plan.turn["role"] == "plan"
        assert_cancelled_and_stopped(base_url, script, llm)


def assert_cancelled_and_stopped(base_url: str, script: MaskScript, llm: ScriptedLLM) -> None:
    """The episode was cancelled while its second call waited, and made no call after it was let go."""
    wait_for(lambda: health(base_url)["cancelled"] == 1, "the episode to be cancelled")
    assert health(base_url)["in_flight"] == 0
    script.release.set()
    wait_for(lambda: health(base_url)["batching"]["policy"]["batches"] == 2, "the held call to return")
    assert [r.role for r in llm.requests] == ["plan", "search"] and script.released == [True]


@pytest.mark.parametrize("endpoint", ["chat", "ask"])
def test_a_stream_past_the_timeout_ends_with_an_error_event(endpoint: str):
    script = MaskScript(hold="search")
    app = make_app(ScriptedLLM(script), method="mask", limits=ServeLimits(request_timeout_s=0.5))
    with serve_on_loopback(app) as base_url:
        try:
            if endpoint == "chat":
                client = openai_client(base_url)
                stream = client.chat.completions.create(model="mask", messages=USER, stream=True)
                with pytest.raises(openai.APIError, match="no answer within the server's 0.5 s request"):
                    list(stream)
            else:
                with httpx.Client(timeout=30) as client, ask_stream(base_url, client) as reply:
                    *_, (name, data) = sse_events(reply.iter_lines())
                assert reply.status_code == 200 and name == "error"
                assert json.loads(data)["detail"] == "no answer within the server's 0.5 s request timeout"
            wait_for(lambda: health(base_url)["cancelled"] == 1, "the episode to be cancelled")
        finally:
            script.release.set()


@pytest.mark.parametrize("endpoint", ["chat", "ask"])
def test_a_backend_failing_mid_stream_ends_it_with_an_error(endpoint: str):
    app = make_app(ScriptedLLM(MaskScript(fail="summary")), method="mask")
    with serve_on_loopback(app) as base_url:
        if endpoint == "chat":
            stream = openai_client(base_url).chat.completions.create(model="mask", messages=USER, stream=True)
            with pytest.raises(openai.APIError, match="backend failed: model server unreachable"):
                list(stream)
            return
        with httpx.Client(timeout=30) as client, ask_stream(base_url, client) as reply:
            events = [(name, json.loads(data)) for name, data in sse_events(reply.iter_lines())]
    assert [name for name, _ in events] == ["turn", "turn", "error"]
    assert events[-1][1]["detail"] == "the mask team's backend failed: model server unreachable"


def test_cli_ask_stream_prints_each_turn_then_the_answer(monkeypatch: pytest.MonkeyPatch):
    import searchteam.factory as factory

    parts = Components(get_team("mask"), {"policy": ScriptedLLM(MaskScript())}, TinyRetriever(PASSAGES))
    monkeypatch.setattr(factory, "build_components", lambda config: parts)
    result = CliRunner().invoke(cli_app, ["ask", QUESTION, "--method", "mask", "--stream"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    roles = [line.split()[1] for line in lines if line.split() and line.split()[0].isdigit()]
    assert roles == MASK_ROLES and lines[-1] == "Answer: Paris"
    assert "searched capital of France → Paris" in result.output and "trace" not in result.output

    parts.llms["policy"] = ScriptedLLM(MaskScript())
    result = CliRunner().invoke(cli_app, ["ask", QUESTION, "--method", "mask", "--stream", "--json"])
    *turns, answer = [json.loads(line) for line in result.output.splitlines()]
    assert [t["turn"]["role"] for t in turns] == MASK_ROLES and answer["answer"] == "Paris"
