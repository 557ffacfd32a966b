"""How full the client keeps a busy inference server: batched requests against request-level dispatch.

A loopback OpenAI-compatible server models a busy engine with continuous batching: it serves any number
of requests at once, each for a time proportional to the tokens it generates (`--seconds-per-token`), and
logs when each arrives and finishes. Each request generates a short reply (`--short` tokens) except one
in `--long-every` (`--long` tokens), chosen by a hash of the prompt, so both clients get the same work.
Two real teams run through `backend: openai` against it, with `--in-flight` requests allowed per process:

- an eval of IRCoT (multi-call: a reasoning sentence per retrieval round, then a reader), greedy;
- a training rollout of Search-R1 (G = 5 at temperature 1, token ids required), whose replies search.

Each runs twice: through the `Batcher` (up to `batch_size` requests per call, each call waiting for its
slowest request: the client before request-level dispatch) and through the `Dispatcher` (each request sent
the moment its episode makes it). Against a perfect client (simulated from the same episodes: each request
sent the moment its episode makes it and a slot is free, no client time), it prints the wall time, the
ratio to the perfect client, and the requests in flight at the server (time-weighted mean and peak).

    python benchmarks/bench_engine_concurrency.py [--questions 128] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import subprocess
import sys
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from loopback import HOST, free_port, wait_until_up
from transformers import AutoTokenizer

from searchteam.llm.models import resolve_model
from searchteam.llm.openai import OpenAIBackend
from searchteam.methods import get_team
from searchteam.runtime import Sampling, run_episodes
from searchteam.runtime.batcher import Batcher
from searchteam.runtime.context import Backends
from searchteam.runtime.runner import batched_search, llm_frontend
from searchteam.teams import TeamSettings
from searchteam.types import Episode, Passage, Question

PASSAGES = [Passage(id=str(i), title=f"Page {i}", text=f"Page {i} is about {i}.") for i in range(5)]
REPLIES = {  # what the engine writes, by the team that asks (the text decides the team's next step)
    "ircot": "The page says something about it.",
    "search_r1": "<search>page</search>",
}


class FixedRetriever:
    name = "fixed"

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [PASSAGES[:k] for _ in queries]


class BusyEngine:
    """The loopback server: `/v1/completions` with token prompts, any number of requests at once."""

    def __init__(self, tokenizer, args: argparse.Namespace) -> None:
        self.tokenizer, self.args = tokenizer, args
        self.log: list[tuple[float, float]] = []  # (arrived, finished), time.time() seconds

    def tokens_for(self, prompt: list[int], max_tokens: int) -> int:
        digest = int(hashlib.sha1(str(prompt).encode()).hexdigest(), 16)
        long = digest % self.args.long_every == 0
        return min(max_tokens, self.args.long if long else self.args.short)

    def app(self) -> FastAPI:
        """The engine's endpoints, and `/bench/reply` (what it writes) and `/bench/log` for the benchmark."""
        app = FastAPI()
        reply = {"text": ""}

        @app.get("/health")
        async def health() -> dict:
            return {}

        @app.post("/bench/reply")
        async def set_reply(request: Request) -> dict:
            reply["text"] = (await request.json())["text"]
            self.log.clear()
            return {}

        @app.get("/bench/log")
        async def log() -> list:
            return self.log

        @app.post("/v1/completions")
        async def completions(request: Request) -> dict:
            arrived = time.time()
            body = await request.json()
            tokens = self.tokens_for(body["prompt"], body["max_tokens"])
            await asyncio.sleep(tokens * self.args.seconds_per_token)
            ids = self.tokenizer.encode(reply["text"], add_special_tokens=False)[:tokens]
            self.log.append((arrived, time.time()))
            choice = {"token_ids": ids, "prompt_token_ids": body["prompt"], "finish_reason": "stop"}
            return {"choices": [choice], "usage": {"completion_tokens": tokens}}

        return app


def in_flight(log: list[tuple[float, float]], start: float, end: float) -> tuple[float, int]:
    """Time-weighted mean and peak of the requests under way at the server between `start` and `end`."""
    events = sorted([(a, 1) for a, _ in log] + [(f, -1) for _, f in log])
    level = peak = 0
    area, last = 0.0, start
    for when, change in events:
        area += level * (when - last)
        level, last = level + change, when
        peak = max(peak, level)
    return area / max(end - start, 1e-9), peak


def perfect_wall(episodes: list[Episode], seconds_per_token: float, slots: int, at_once: int) -> float:
    """Wall time of a client that sends each request the moment its episode makes it and a slot is free,
    with no time of its own: the same episodes' requests in order, each taking its engine time."""
    chains = [[t.completion_tokens * seconds_per_token for t in e.turns] for e in episodes]
    ready: list[tuple[float, int, int]] = []  # (ready at, episode, request index)
    for i in range(min(at_once, len(chains))):
        heapq.heappush(ready, (0.0, i, 0))
    next_episode, busy, wall = min(at_once, len(chains)), [0.0] * slots, 0.0
    while ready:
        at, i, j = heapq.heappop(ready)
        slot = min(range(slots), key=busy.__getitem__)
        done = max(at, busy[slot]) + chains[i][j]
        busy[slot], wall = done, max(wall, done)
        if j + 1 < len(chains[i]):
            heapq.heappush(ready, (done, i, j + 1))
        elif next_episode < len(chains):
            heapq.heappush(ready, (done, next_episode, 0))
            next_episode += 1
    return wall


def run(method: str, frontend: str, url: str, tokenizer, args: argparse.Namespace) -> dict:
    """One run of `method` through `frontend` (batcher | dispatcher); wall time and in-flight numbers."""
    training = method == "search_r1"
    team = get_team(method, TeamSettings(top_k=3, max_turns=args.turns))
    httpx.post(f"{url}/bench/reply", json={"text": REPLIES[method]}).raise_for_status()
    backend = OpenAIBackend("busy-engine", f"{url}/v1", tokenizer=tokenizer, concurrency=args.in_flight)
    if training:
        backend.for_training(tokenizer)
    llm = Batcher(backend.generate, args.in_flight) if frontend == "batcher" else llm_frontend(backend, 1)
    backends = Backends(llms={"policy": llm}, search=Batcher(batched_search(FixedRetriever()), 64))
    group = 5 if training else 1
    questions = [
        Question(id=f"q{i // group}", question=f"Which page says something about {i // group}?")
        for i in range(args.questions * group)
    ]
    sampling = Sampling(temperature=1.0 if training else 0.0, max_new_tokens=args.long)
    start = time.time()
    episodes, _ = asyncio.run(
        run_episodes(
            team.solve,
            method,
            questions,
            backends,
            sampling,
            concurrency=args.episodes,
            progress=False,
            training=training,
        )
    )
    wall = time.time() - start
    failed = [e.error for e in episodes if e.error]
    if failed:
        raise SystemExit(f"{len(failed)} episodes failed, e.g. {failed[0]}")
    log = [tuple(pair) for pair in httpx.get(f"{url}/bench/log").json()]
    mean, peak = in_flight(log, start, start + wall)
    perfect = perfect_wall(episodes, args.seconds_per_token, args.in_flight, args.episodes)
    return dict(wall=wall, perfect=perfect, mean=mean, peak=peak, requests=len(log))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=128, help="eval questions; rollouts: /5 of it x G=5")
    parser.add_argument("--in-flight", type=int, default=32, help="server.concurrency (and batch_size)")
    parser.add_argument("--episodes", type=int, default=64, help="episodes in flight (concurrency)")
    parser.add_argument("--turns", type=int, default=3, help="max_turns of both teams")
    parser.add_argument("--seconds-per-token", type=float, default=0.01)
    parser.add_argument("--short", type=int, default=20, help="tokens of most replies")
    parser.add_argument("--long", type=int, default=300, help="tokens of one reply in --long-every")
    parser.add_argument("--long-every", type=int, default=8)
    parser.add_argument("--methods", default="ircot,search_r1")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the engine's process
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    if args.serve:
        uvicorn.run(BusyEngine(tokenizer, args).app(), host=HOST, port=args.serve, log_level="error")
        return
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--serve", str(port)])
    url = f"http://{HOST}:{port}"
    try:
        wait_until_up(url, server, timeout_s=60)
        header = f"{'requests':>8} {'wall s':>7} {'perfect s':>9} {'ratio':>6} {'in flight':>9} {'peak':>5}"
        print(f"{'run':<36} {header}")
        for method in args.methods.split(","):
            size = args.questions if method != "search_r1" else args.questions // 5
            for frontend in ("batcher", "dispatcher"):
                sized = argparse.Namespace(**{**vars(args), "questions": size})
                r = run(method, frontend, url, tokenizer, sized)
                label = f"{method} ({'eval' if method != 'search_r1' else 'rollout G=5'}), {frontend}"
                print(
                    f"{label:<36} {r['requests']:>8} {r['wall']:>7.1f} {r['perfect']:>9.1f} "
                    f"{r['wall'] / r['perfect']:>6.2f} {r['mean']:>9.1f} {r['peak']:>5}",
                    flush=True,
                )
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
