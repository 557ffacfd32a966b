"""Request-level concurrency for engines that batch on their side: each request leaves the moment an
episode makes it, with at most `server.concurrency` in flight, so no request waits for another to finish."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchteam.llm.base import GenerationRequest, SamplingParams
from searchteam.llm.openai import OpenAIBackend
from searchteam.runtime import make_backends
from searchteam.runtime.batcher import Batcher, Dispatcher
from tests.fake_vllm import byte_tokenizer
from tests.helpers import serve_on_loopback

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
    from searchteam.llm.scripted import ScriptedLLM

    (frontend,) = make_backends({"policy": ScriptedLLM(lambda r: "x")}, None, max_batch=16).llms.values()
    assert isinstance(frontend, Batcher) and frontend.max_batch == 16


async def test_a_prompt_longer_than_the_context_fails_its_episode_only():
    from searchteam.methods import get_team
    from searchteam.runtime import Sampling, run_episodes
    from searchteam.types import Question
    from tests.helpers import PASSAGES, TinyRetriever

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
