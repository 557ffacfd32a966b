"""Prompt throughput of the ov backend on this CPU, and whether the KV-cache size or searchteam's explicit
generation config changes it: N distinct prompts of ~740 tokens (no shared prefix beyond the chat template)
sent at once, 32 new tokens each, greedy, one `generate` call per setting, in one process.

    nice -n 10 python benchmarks/bench_ov_prefill.py [--prompts 16] [--model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from searchteam.llm.base import GenerationRequest, SamplingParams, render_chat
from searchteam.llm.models import DEFAULT_MODEL
from searchteam.llm.ov import OVBackend, generation_config

WORDS = ["river", "mountain", "city", "novel", "author", "born", "capital", "war", "king", "queen", "bridge"]
NEW_TOKENS = 32


def prompt_ids(tokenizer, n: int, salt: str, words: int = 700) -> list[list[int]]:
    """`n` prompts of `words` random words each, different for every `salt` so no run reuses another's
    cache."""
    prompts = []
    for i in range(n):
        rng = random.Random(f"{salt}-{i}")
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        messages = [{"role": "user", "content": f"Document: {text}\nWhich city?"}]
        request = GenerationRequest(messages, SamplingParams())
        prompts.append(tokenizer(render_chat(tokenizer, request), add_special_tokens=False)["input_ids"])
    return prompts


def plain_config(eos_token_id: int):
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = NEW_TOKENS
    config.set_eos_token_id(eos_token_id)
    return config


def timed(backend: OVBackend, n: int, salt: str, plain: bool) -> float:
    """Prompt tokens per second of one `generate` call over `n` fresh prompts."""
    import openvino as ov

    tok = backend.tokenizer
    pipeline = next(iter(backend._pipelines.values()))[0]
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS)
    ours = generation_config(sampling, tok.eos_token_id, {tok.eos_token_id}, None)
    ids = prompt_ids(tok, n, salt)
    inputs = [ov.Tensor(np.asarray([x], dtype=np.int64)) for x in ids]
    configs = [plain_config(tok.eos_token_id) if plain else ours for _ in ids]
    start = time.perf_counter()
    pipeline.generate(inputs, configs)
    seconds = time.perf_counter() - start
    return sum(map(len, ids)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    rates = {}
    settings = [("1 GB cache", 1, False), ("4 GB cache", 4, False), ("plain config", 1, True)]
    for name, cache_gb, plain in settings:
        backend = OVBackend(args.model, cache_gb=cache_gb)
        timed(backend, 2, "warm-up", plain)
        rates[name] = timed(backend, args.prompts, name, plain)
        print(f"{name}: {args.prompts} prompts of ~740 tokens, {rates[name]:.0f} prompt tokens/s", flush=True)
        del backend
    base = rates["1 GB cache"]
    print(f"ratio 4 GB / 1 GB cache: {rates['4 GB cache'] / base:.2f}")
    print(f"ratio plain / searchteam config: {rates['plain config'] / base:.2f}")


if __name__ == "__main__":
    main()
