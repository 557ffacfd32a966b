"""A long load on `searchteam serve`: 32 clients for 10 minutes on loopback, with a scripted model.

The server is searchteam's own app and `serve` (uvicorn), in its own process, with the real BM25 retriever
over the shipped corpus and the method's real team; only the model is a scripted double that answers with
a few words of the question after `--model-ms` (so the load measures the server, not a model). The clients
cycle through the four ways to ask: /v1/chat/completions and /ask, each plain and streamed (a stream is
read to its end). Reports requests served, errors, p50 and p99 latency, and the server's resident memory
before the load, after the warm-up (the first tenth of the run) and at the end. Targets: no error, and
memory at the end within 5 % of the warm-up's.

    .venv/bin/python benchmarks/soak_serve.py                       # 10 minutes, 32 clients
    .venv/bin/python benchmarks/soak_serve.py --seconds 20 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from loopback import HOST, free_port, wait_until_up

from searchteam.data import load_benchmark
from searchteam.http_client import limits

ROUTES = ("chat", "ask", "chat-stream", "ask-stream")


def serve_scripted(method: str, port: int, model_ms: float) -> None:
    """The server process: the method's team over BM25 and a scripted model, served as `searchteam serve`
    serves it."""
    from searchteam.config import RunConfig
    from searchteam.factory import Components
    from searchteam.llm.scripted import ScriptedLLM
    from searchteam.methods import get_team
    from searchteam.retrieval import build_retriever
    from searchteam.serve import build_service, serve

    def answer(request) -> str:
        time.sleep(model_ms / 1000)  # in the batcher's thread, as a model's forward would be
        words = request.messages[-1]["content"].split()[:3]
        return f"<answer>{' '.join(words)}</answer>"

    llm = ScriptedLLM(answer, record=False)
    parts = Components(get_team(method), {"policy": llm}, build_retriever("bm25"))
    service = build_service(RunConfig(method=method, model="scripted"), parts)
    serve(service, host=HOST, port=port)


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def ask(client: httpx.AsyncClient, url: str, route: str, question: str, method: str) -> None:
    """One request; raises on any answer but a complete 200."""
    stream = route.endswith("-stream")
    if route.startswith("chat"):
        path, body = (
            "/v1/chat/completions",
            {"model": method, "messages": [{"role": "user", "content": question}]},
        )
    else:
        path, body = "/ask", {"question": question}
    body["stream"] = stream
    if not stream:
        response = await client.post(f"{url}{path}", json=body)
        response.raise_for_status()
        response.json()
        return
    async with client.stream("POST", f"{url}{path}", json=body) as response:
        response.raise_for_status()
        text = "".join([chunk async for chunk in response.aiter_text()])
    if "event: error" in text or ("[DONE]" not in text and "event: answer" not in text):
        raise RuntimeError(f"{route} stream ended without its answer: {text[-200:]!r}")


async def load(url: str, args: argparse.Namespace, questions: list[str], pid: int) -> dict:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    memory = [(0.0, resident_mib(pid))]
    order = itertools.count()
    start = time.perf_counter()
    deadline = start + args.seconds

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            i = next(order)
            began = time.perf_counter()
            try:
                await ask(client, url, ROUTES[i % len(ROUTES)], questions[i % len(questions)], args.method)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            latencies.append(time.perf_counter() - began)

    async def sample_memory() -> None:
        while time.perf_counter() < deadline:
            await asyncio.sleep(min(args.sample_seconds, max(0.0, deadline - time.perf_counter())))
            memory.append((time.perf_counter() - start, resident_mib(pid)))

    timeout = httpx.Timeout(args.timeout, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits(args.clients)) as client:
        await asyncio.gather(sample_memory(), *(client_loop(client) for _ in range(args.clients)))
    wall = time.perf_counter() - start
    return {"latencies": latencies, "errors": dict(errors), "memory": memory, "wall": wall}


def summarize(result: dict, args: argparse.Namespace, health: dict) -> dict:
    latencies, memory = np.array(result["latencies"]), result["memory"]
    warm = next(mib for t, mib in memory if t >= args.seconds / 10) if len(memory) > 1 else memory[0][1]
    end = memory[-1][1]
    p50, p99 = np.percentile(latencies, [50, 99]) if len(latencies) else (float("nan"),) * 2
    return {
        "method": args.method,
        "clients": args.clients,
        "seconds": round(result["wall"], 1),
        "requests": len(latencies),
        "errors": sum(result["errors"].values()),
        "error_kinds": result["errors"],
        "served": health["served"],
        "requests_per_second": round(len(latencies) / result["wall"], 1),
        "latency_p50_s": round(float(p50), 4),
        "latency_p99_s": round(float(p99), 4),
        "rss_mib_before": round(memory[0][1], 1),
        "rss_mib_warm": round(warm, 1),
        "rss_mib_end": round(end, 1),
        "rss_growth_after_warmup": round(end / warm - 1, 4),
        "rss_samples": [(round(t, 1), round(m, 1)) for t, m in memory],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="naive_rag")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--model-ms", type=float, default=20.0, help="the scripted model's time per batch")
    parser.add_argument("--sample-seconds", type=float, default=10.0, help="how often memory is read")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--serve-on", type=int, help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if args.serve_on:
        serve_scripted(args.method, args.serve_on, args.model_ms)
        return

    questions = [q.question for q in load_benchmark(["nq", "hotpotqa"], "dev", 200)]
    port = free_port()
    url = f"http://{HOST}:{port}"
    command = [sys.executable, __file__, "--serve-on", str(port), "--method", args.method,
               "--model-ms", str(args.model_ms)]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        wait_until_up(url, server, timeout_s=120)
        result = asyncio.run(load(url, args, questions, server.pid))
        health = httpx.get(f"{url}/health", timeout=10).json()
    finally:
        server.terminate()
        server.wait(timeout=30)
    figures = summarize(result, args, health)
    print(
        f"{figures['method']}: {figures['clients']} clients for {figures['seconds']} s, "
        f"{figures['requests']} requests ({figures['requests_per_second']}/s), {figures['errors']} errors"
        + (f" {figures['error_kinds']}" if figures["errors"] else "")
    )
    print(
        f"latency: p50 {figures['latency_p50_s'] * 1000:.1f} ms, p99 {figures['latency_p99_s'] * 1000:.1f} ms"
    )
    print(
        f"server RSS: {figures['rss_mib_before']} MiB before the load, {figures['rss_mib_warm']} MiB after "
        f"the warm-up, {figures['rss_mib_end']} MiB at the end ({figures['rss_growth_after_warmup']:+.1%})"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
