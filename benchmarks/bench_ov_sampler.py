"""Cost of running GenAI's sampler on one thread (what the ov backend does, to avoid a deadlock) against
GenAI's default of one thread per core, on decoding, where the sampler runs: N short prompts at once, 96 new
tokens each, greedy, with a stop string that never matches (so every token is checked against it). The two
pipelines alternate over `--rounds` rounds in one process; each round's prompts are new.

    python benchmarks/bench_ov_sampler.py [--prompts 16] [--rounds 3] [--model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from searchteam.llm.base import GenerationRequest, SamplingParams, render_chat
from searchteam.llm.models import DEFAULT_MODEL
from searchteam.llm.ov import SAMPLER_THREADS, OVBackend, generation_config

SAMPLING = SamplingParams(max_new_tokens=96, stop=("<never-generated>",))


def decode_rate(backend: OVBackend, pipeline, n: int, salt: str) -> float:
    """Generated tokens per second of one `generate` call over `n` new prompts."""
    import openvino as ov

    tok = backend.tokenizer
    requests = [
        GenerationRequest([{"role": "user", "content": f"Tell a story #{salt}-{i}."}], SAMPLING)
        for i in range(n)
    ]
    prompts = [tok(render_chat(tok, r), add_special_tokens=False)["input_ids"] for r in requests]
    inputs = [ov.Tensor(np.asarray([ids], dtype=np.int64)) for ids in prompts]
    config = generation_config(SAMPLING, tok.eos_token_id, {tok.eos_token_id}, None)
    config.ignore_eos = True  # every sequence decodes all 96 tokens
    start = time.perf_counter()
    outputs = pipeline.generate(inputs, [config] * n)
    seconds = time.perf_counter() - start
    return sum(len(out.m_generation_ids[0]) for out in outputs) / seconds


def main() -> None:
    import openvino_genai as ov_genai

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    backend = OVBackend(args.model)
    default_threads = os.cpu_count()
    pipelines = {
        threads: ov_genai.ContinuousBatchingPipeline(
            str(backend.model_dir), ov_genai.SchedulerConfig(), "CPU", {"sampler_num_threads": threads}
        )
        for threads in (SAMPLER_THREADS, default_threads)
    }
    rates: dict[int, list[float]] = {threads: [] for threads in pipelines}
    for threads, pipeline in pipelines.items():
        decode_rate(backend, pipeline, 2, f"warm-up-{threads}")
    for r in range(args.rounds):
        for threads, pipeline in pipelines.items():
            rates[threads].append(decode_rate(backend, pipeline, args.prompts, f"{r}-{threads}"))
            print(
                f"round {r}, {threads} sampler thread(s): {rates[threads][-1]:.1f} generated tokens/s",
                flush=True,
            )
    ours, default = (float(np.median(rates[t])) for t in (SAMPLER_THREADS, default_threads))
    print(f"median tokens/s: {ours:.1f} with {SAMPLER_THREADS}, {default:.1f} with {default_threads}")
    print(f"ratio {SAMPLER_THREADS} thread / {default_threads} threads: {ours / default:.3f}")


if __name__ == "__main__":
    main()
