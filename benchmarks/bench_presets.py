"""The 0.5B and 1.5B presets on this CPU, in one run: conversion time (GGUF to safetensors, then the OpenVINO
int8 IR), IR size, the engine's resident memory, prefill and decode tokens per second, and the prefill FLOP
rate (2 x the transformer layers' weights per prompt token; embeddings and the LM head, which prefill
applies to the last token only, are left out), for the ov backend's settings and for variants of the
engine's settings on the 1.5B.

Each measurement runs in a child process of its own (a clean resident-memory reading), one at a time:
prefill is 8 distinct prompts of ~740 tokens sent at once with one new token each; decode is 4 short prompts
with 64 new tokens each (EOS ignored), minus the prefill of those prompts.

    python benchmarks/bench_presets.py [--cache DIR] [--variants default,batch1024,kv_f16,threads2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_ov_prefill import prompt_ids  # the same random-word prompts

PRESETS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
# engine settings tried on the 1.5B: scheduler fields and CPU plugin properties on top of the ov backend's
VARIANTS: dict[str, dict[str, dict[str, object]]] = {
    "default": {},
    "batch1024": {"scheduler": {"max_num_batched_tokens": 1024}},
    "batch64": {"scheduler": {"max_num_batched_tokens": 64}},
    "kv_f16": {"properties": {"KV_CACHE_PRECISION": "f16"}},
    "threads2": {"properties": {"INFERENCE_NUM_THREADS": 2, "NUM_STREAMS": 1}},
    "latency": {"properties": {"PERFORMANCE_HINT": "LATENCY"}},
}


def measure(preset: str, variant: str) -> dict[str, float]:
    """In this process: build the engine with `variant`'s settings and time prefill and decode."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai
    import psutil
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model
    from searchteam.llm.ov import SAMPLER_THREADS
    from searchteam.llm.ov_export import openvino_model_dir

    settings = VARIANTS[variant]
    checkpoint = resolve_model(preset)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rss = psutil.Process().memory_info().rss
    scheduler = ov_genai.SchedulerConfig()
    scheduler.cache_size = 1
    for key, value in settings.get("scheduler", {}).items():
        setattr(scheduler, key, value)
    properties = {"sampler_num_threads": SAMPLER_THREADS, **settings.get("properties", {})}
    pipeline = ov_genai.ContinuousBatchingPipeline(
        str(openvino_model_dir(preset)), scheduler, "CPU", properties
    )
    engine_rss = psutil.Process().memory_info().rss - rss

    def run(ids: list[list[int]], new_tokens: int) -> float:
        generation = ov_genai.GenerationConfig()
        generation.max_new_tokens = new_tokens
        generation.min_new_tokens = new_tokens
        generation.ignore_eos = True
        inputs = [ov.Tensor(np.asarray([x], dtype=np.int64)) for x in ids]
        start = time.perf_counter()
        pipeline.generate(inputs, [generation] * len(ids))
        return time.perf_counter() - start

    run(prompt_ids(tokenizer, 2, f"{variant}-warm", words=200), 2)
    long = prompt_ids(tokenizer, 8, f"{variant}-prefill")
    prefill_s = run(long, 1)
    short = prompt_ids(tokenizer, 4, f"{variant}-decode", words=8)
    short_prefill_s = run(prompt_ids(tokenizer, 4, f"{variant}-decode-p", words=8), 1)
    decode_s = run(short, 65) - short_prefill_s
    engine_rss = psutil.Process().memory_info().rss - rss  # after use: the IR is mapped in as it is read
    params = sum(n for name, n in _sizes(checkpoint) if name.startswith("model.layers."))
    prefill_tps = sum(map(len, long)) / prefill_s
    return {
        "engine_rss_gb": engine_rss / 2**30,
        "prefill_tokens_per_s": prefill_tps,
        "decode_tokens_per_s": 4 * 64 / decode_s,
        "layer_params": params,
        "prefill_gflops": 2 * params * prefill_tps / 1e9,
    }


def _sizes(checkpoint: str):
    """(name, element count) of every tensor of the safetensors checkpoint, read from its header."""
    from safetensors import safe_open

    for path in Path(checkpoint).glob("*.safetensors"):
        with safe_open(path, "np") as f:
            for name in f.keys():  # noqa: SIM118
                yield name, math.prod(f.get_slice(name).get_shape())


def convert(preset: str) -> dict[str, float]:
    """In this process: both conversions of `preset`, timed, and the IR's size."""
    from searchteam.llm.models import resolve_model
    from searchteam.llm.ov_export import openvino_model_dir

    start = time.perf_counter()
    resolve_model(preset)
    safetensors_s = time.perf_counter() - start
    start = time.perf_counter()
    ir = openvino_model_dir(preset)
    ir_s = time.perf_counter() - start
    size = sum(p.stat().st_size for p in ir.iterdir() if p.is_file())
    return {"safetensors_s": safetensors_s, "ir_s": ir_s, "ir_mb": size / 1e6}


def child(*args: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="cache to convert into (default: a new one)")
    parser.add_argument("--variants", default="default,batch1024,kv_f16,threads2")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, preset, *variant = args.child
        print(json.dumps(convert(preset) if kind == "convert" else measure(preset, variant[0])))
        return
    os.environ["SEARCHTEAM_CACHE"] = str(args.cache or tempfile.mkdtemp(prefix="bench-presets-"))
    print(f"cache: {os.environ['SEARCHTEAM_CACHE']}")
    print("| preset | safetensors s | IR s | IR MB |\n|---|---|---|---|")
    for preset in PRESETS:
        c = child("--child", "convert", preset)
        print(f"| {preset} | {c['safetensors_s']:.0f} | {c['ir_s']:.0f} | {c['ir_mb']:.0f} |", flush=True)
    print("\n| preset | settings | engine RSS GB | prefill tok/s | decode tok/s | prefill GFLOP/s |")
    print("|---|---|---|---|---|---|")
    rates = {}
    runs = [(PRESETS[0], "default")] + [(PRESETS[1], v) for v in args.variants.split(",")]
    for preset, variant in runs:
        m = child("--child", "measure", preset, variant)
        rates[preset, variant] = m["prefill_gflops"]
        print(f"| {preset} | {variant} | {m['engine_rss_gb']:.2f} | {m['prefill_tokens_per_s']:.0f} | "
              f"{m['decode_tokens_per_s']:.1f} | {m['prefill_gflops']:.1f} |", flush=True)  # fmt: skip
    base = rates[PRESETS[0], "default"]
    for (preset, variant), rate in rates.items():
        if preset == PRESETS[1]:
            print(f"1.5B {variant} / 0.5B default prefill FLOP rate: {rate / base:.2f}")


if __name__ == "__main__":
    main()
