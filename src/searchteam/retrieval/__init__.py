"""Retrievers behind one protocol: bm25 (bm25s), dense (sentence-transformers + faiss, built here or a
prebuilt FAISS index), remote HTTP; any of them optionally followed by a reranker (`retrieval.rerank`).

Back-ends are imported on demand, so `import searchteam.retrieval` stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from searchteam.data import CORPUS_PATH
from searchteam.errors import RetrievalError
from searchteam.retrieval.base import Retriever
from searchteam.retrieval.corpus import load_corpus

RETRIEVER_CHOICES = ("bm25", "dense", "dense:INDEX_FILE", "http://HOST:PORT", "https://HOST:PORT")
PREBUILT_PREFIX = "dense:"


def build_retriever(
    spec: str = "bm25",
    *,
    corpus: str | Path | None = None,
    embedder: str | None = None,
    query_prefix: str = "",
    passage_prefix: str = "",
    reranker: str | None = None,
    rerank_depth: int = 20,
) -> Retriever:
    """A retriever from a short spec: `bm25`, `dense`, `dense:INDEX_FILE`, or the URL of a retrieval server.

    `dense:INDEX_FILE` searches a prebuilt FAISS index (e.g. Search-R1's `e5_Flat.index`) and needs `corpus`,
    the JSONL it was built from, and `embedder`, the model that built it; an empty `query_prefix` means the
    embedder's usual one ("query: " for E5, as FlashRAG and Search-R1 add). With `reranker` (a model, see
    `retrieval.rerank.build_scorer`), each search fetches `rerank_depth` candidates and keeps the k the
    reranker scores best."""
    base = _base_retriever(spec, corpus, embedder, query_prefix, passage_prefix)
    if not reranker:
        return base
    from searchteam.retrieval.rerank import RerankingRetriever, build_scorer

    return RerankingRetriever(base, build_scorer(reranker), rerank_depth)


def _base_retriever(
    spec: str, corpus: str | Path | None, embedder: str | None, query_prefix: str, passage_prefix: str
) -> Retriever:
    corpus_path = Path(corpus) if corpus is not None else CORPUS_PATH
    if spec == "bm25":
        from searchteam.retrieval.bm25 import BM25Retriever

        return BM25Retriever(corpus_path)
    if spec == "dense":
        from searchteam.retrieval.dense import DenseRetriever

        return DenseRetriever(corpus_path, embedder, query_prefix=query_prefix, passage_prefix=passage_prefix)
    if spec.startswith(PREBUILT_PREFIX):
        return _prebuilt(spec.removeprefix(PREBUILT_PREFIX), corpus, embedder, query_prefix)
    if spec.startswith(("http://", "https://")):
        from searchteam.retrieval.http import HTTPRetriever

        return HTTPRetriever(spec)
    raise RetrievalError(f"unknown retriever '{spec}'; choose one of: {', '.join(RETRIEVER_CHOICES)}")


def _prebuilt(index: str, corpus: str | Path | None, embedder: str | None, query_prefix: str) -> Retriever:
    from searchteam.retrieval.prebuilt import PrebuiltDenseRetriever

    if not index:
        raise RetrievalError("'dense:' needs a FAISS index file after the colon, as in dense:e5_Flat.index")
    if corpus is None:
        raise RetrievalError(
            f"the prebuilt index {index} needs the corpus it was built from: pass --corpus FILE.jsonl"
        )
    return PrebuiltDenseRetriever(index, corpus, embedder, query_prefix=query_prefix or None)


__all__ = ["RETRIEVER_CHOICES", "Retriever", "build_retriever", "load_corpus"]
