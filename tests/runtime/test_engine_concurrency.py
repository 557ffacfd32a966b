"""Request-level concurrency for engines that batch on their side: each request leaves the moment an
episode makes it, with at most `server.concurrency` in flight, so no request waits for another to finish."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchteam.errors import LLMError
from searchteam.llm.base import GenerationRequest, SamplingParams
from searchteam.llm.openai import OpenAIBackend
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.runtime.batcher import Batcher, Dispatcher
from searchteam.types import Question
from tests.support.fake_vllm import FakeVLLM, byte_tokenizer
from tests.support.helpers import PASSAGES, TinyRetriever, serve_on_loopback

SECONDS_PER_TOKEN = 0.002  # the busy engine's service time per requested token
CONTEXT = 4096  # the engine's context length, in tokens
TOKENIZER = byte_tokenizer()
OK_IDS = TOKENIZER.encode("ok", add_special_tokens=False)


class BusyEngine:
    """An OpenAI-compatible completions endpoint that serves any number of requests at once, each for a
    time proportional to its `max_tokens`, and counts the requests in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.refused = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/completions", response_model=None)
        async def completions(request: Request) -> dict | JSONResponse:
            body = await request.json()
            if len(body["prompt"]) + body["max_tokens"] > CONTEXT:
                self.refused += 1
                message = f"This model's maximum context length is {CONTEXT} tokens. However, you requested"
                return JSONResponse({"error": {"message": message, "type": "BadRequestError"}}, 400)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                await asyncio.sleep(body["max_tokens"] * SECONDS_PER_TOKEN)
            finally:
                self.in_flight -= 1
            choice = {"text": "ok", "token_ids": OK_IDS, "prompt_token_ids": body["prompt"]}
            return {"choices": [choice | {"finish_reason": "stop"}], "usage": {"completion_tokens": 2}}

        return app


def request(tokens: int, text: str = "hi") -> GenerationRequest:
    return GenerationRequest([{"role": "user", "content": text}], SamplingParams(max_new_tokens=tokens))


async def test_dispatcher_keeps_at_most_its_limit_in_flight_and_fills_it():
    in_flight, seen = 0, []

    async def process(x: int) -> int:
        nonlocal in_flight
        in_flight += 1
        seen.append(in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return 2 * x

    dispatcher = Dispatcher(process, limit=5)
    assert await asyncio.gather(*(dispatcher.submit(i) for i in range(20))) == [2 * i for i in range(20)]
    assert max(seen) == 5 and dispatcher.stats.peak_in_flight == 5
    assert dispatcher.stats.items == 20 and dispatcher.stats.busy_seconds > 0


async def test_an_http_engine_gets_requests_one_by_one_up_to_server_concurrency():
    engine = BusyEngine()
    with serve_on_loopback(engine.app()) as url:
        backend = OpenAIBackend("m", url, tokenizer=TOKENIZER, concurrency=4)
        (frontend,) = make_backends({"policy": backend}, None, max_batch=32).llms.values()
        assert isinstance(frontend, Dispatcher) and frontend.limit == 4
        completions = await asyncio.gather(*(frontend.submit(request(5)) for _ in range(12)))
        await frontend.aclose()
    assert [c.text for c in completions] == ["ok"] * 12
    assert engine.peak == 4 and frontend.stats.peak_in_flight == 4


async def test_a_slow_request_holds_back_no_other_episode():
    """One episode's long generation is under way while another makes ten short calls in a row: the short
    episode finishes first. (A batcher held each short call back until the long one was done.)"""
    engine = BusyEngine()
    with serve_on_loopback(engine.app()) as url:
        backend = OpenAIBackend("m", url, tokenizer=TOKENIZER, concurrency=8)
        (frontend,) = make_backends({"policy": backend}, None).llms.values()
        finished: list[str] = []

        async def episode(name: str, calls: int, tokens: int) -> None:
            for _ in range(calls):
                await frontend.submit(request(tokens))
            finished.append(name)

        started = time.perf_counter()
        await asyncio.gather(episode("long", 1, 1000), episode("short", 10, 10))
        await frontend.aclose()
    assert finished == ["short", "long"], f"after {time.perf_counter() - started:.2f} s"


def test_in_process_engines_keep_the_batcher():
    (frontend,) = make_backends({"policy": ScriptedLLM(lambda r: "x")}, None, max_batch=16).llms.values()
    assert isinstance(frontend, Batcher) and frontend.max_batch == 16


async def test_a_prompt_longer_than_the_context_fails_its_episode_only():

    engine = BusyEngine()
    questions = [
        Question(id=str(i), question=f"Where is Paris? {'very ' * 1000 * (i == 1)}") for i in range(3)
    ]
    with serve_on_loopback(engine.app()) as url:
        backend = OpenAIBackend("m", url, tokenizer=TOKENIZER, max_retries=3)
        backends = make_backends({"policy": backend}, TinyRetriever(PASSAGES))
        team = get_team("naive_rag")
        episodes, _ = await run_episodes(
            team.solve, "naive_rag", questions, backends, Sampling(), progress=False
        )
    assert [e.error is None for e in episodes] == [True, False, True]
    assert episodes[1].error.startswith("RequestRejected") and "maximum context length" in episodes[1].error
    assert engine.refused == 1  # not retried: only transient failures are


async def test_several_servers_each_load_the_adapters_and_share_the_episodes(tmp_path):
    """Two replicas: the adapter loads on both, every episode's requests go to one of them, both get
    episodes, and closing unloads from both."""
    adapter = tmp_path / "policy"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    fakes = [FakeVLLM(tokenizer=TOKENIZER), FakeVLLM(tokenizer=TOKENIZER)]
    with serve_on_loopback(fakes[0].app()) as first, serve_on_loopback(fakes[1].app()) as second:
        backend = OpenAIBackend("base", [first, second], tokenizer=TOKENIZER, concurrency=8)
        (name,) = backend.load_adapters({"": adapter}).values()
        assert all(list(fake.loras) == [name] for fake in fakes)
        (frontend,) = make_backends({"policy": backend}, None).llms.values()

        async def episode(session: str) -> None:
            for call in range(3):
                text = f"episode {session} call {call}"
                await frontend.submit(GenerationRequest([{"role": "user", "content": text}], session=session))

        await asyncio.gather(*(episode(f"e{i}") for i in range(8)))
        await frontend.aclose()
        backend.close()
    sessions = [
        [TOKENIZER.decode(p).split("episode ")[1].split(" ")[0] for p in fake.prompts] for fake in fakes
    ]
    assert all(sessions) and not set(sessions[0]) & set(sessions[1])  # each episode on one server
    assert sorted(sessions[0] + sessions[1]) == sorted(f"e{i}" for i in range(8) for _ in range(3))
    assert all(fake.requests[-1]["model"] == name for fake in fakes) and not any(f.loras for f in fakes)


def test_a_server_that_fails_is_named(tmp_path):
    with serve_on_loopback(FakeVLLM(tokenizer=TOKENIZER).app()) as alive:
        backend = OpenAIBackend("base", [alive, "http://127.0.0.1:9/v1"], tokenizer=TOKENIZER, max_retries=0)
        (tmp_path / "adapter_config.json").write_text('{"r": 8}')
        with pytest.raises(LLMError, match=r"vLLM at http://127.0.0.1:9/v1 unreachable"):
            backend.load_adapters({"": tmp_path})


async def test_a_request_waiting_for_a_pooled_connection_is_not_timed_out_and_sent_again():
    """Five requests on a pool of one connection, each answered in 0.3 s under a 0.5 s read timeout: the
    last waits 1.2 s for the connection, and each is sent once. The wait for a connection has no timeout
    of its own (the backend bounds its requests at the pool's size)."""
    engine = BusyEngine()
    with serve_on_loopback(engine.app()) as url:
        backend = OpenAIBackend("m", url, tokenizer=TOKENIZER, concurrency=1, timeout=0.5, max_retries=0)
        completions = await asyncio.gather(*(backend.agenerate(request(150)) for _ in range(5)))
        await backend.aclose()
    assert [c.text for c in completions] == ["ok"] * 5 and engine.peak == 1
    assert backend._new_client().timeout.pool is None  # noqa: SLF001


def test_clients_close_idle_connections_before_the_server_does():
    """An idle connection is closed by the client before uvicorn (vLLM's and searchteam's servers) closes
    it, so a request never goes out on a connection the server is closing."""
    import uvicorn

    from searchteam.http_client import limits
    from searchteam.retrieval.http import HTTPRetriever

    server_keep_alive = uvicorn.Config(FastAPI()).timeout_keep_alive
    backend = OpenAIBackend("m", "http://127.0.0.1:9/v1", tokenizer=TOKENIZER)
    pool = backend._new_client()._transport._pool  # noqa: SLF001
    retriever = HTTPRetriever("http://127.0.0.1:9")._client._transport._pool  # noqa: SLF001
    assert pool._keepalive_expiry == retriever._keepalive_expiry == limits(1).keepalive_expiry  # noqa: SLF001
    assert limits(1).keepalive_expiry < server_keep_alive
