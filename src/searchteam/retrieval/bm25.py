"""Sparse retrieval with bm25s: the index is built once per corpus and parameters, then cached on disk (a
checked, self-healing cache entry: `searchteam.cache`)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from searchteam.cache import ensure_cache, require_files, write_manifest
from searchteam.data import CORPUS_PATH
from searchteam.retrieval.cache import COMPLETE_MARKER, build_atomically, index_dir
from searchteam.retrieval.corpus import PassageTable, corpus_fingerprint, load_corpus, passage_text
from searchteam.types import Passage

log = logging.getLogger(__name__)

INDEX_FORMAT = 1
PASSAGES_FILE = "passages.json"

_local = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    """One PyStemmer per thread: its C state is not safe to share across server threads."""
    if not hasattr(_local, "stemmer"):
        _local.stemmer = Stemmer.Stemmer("english")
    return _local.stemmer


def tokenize(texts: list[str]) -> list[list[str]]:
    """Lower-cased word tokens, English stop words removed, Snowball-stemmed (bm25s' tokenizer)."""
    return bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False)


class BM25Retriever:
    """BM25 (Lucene variant) over a JSONL corpus; `search` is batched and thread-safe.

    `n_threads` is bm25s' per-batch thread pool. It defaults to 0 (in-line) because on 2 cores the pool
    measured no faster: numpy scoring of one query holds the GIL for most of its ~1 ms.
    """

    name = "bm25"

    def __init__(
        self, corpus_path: str | Path = CORPUS_PATH, k1: float = 0.9, b: float = 0.4, n_threads: int = 0
    ) -> None:
        self.corpus_path = Path(corpus_path)
        self.k1, self.b, self.n_threads = k1, b, n_threads
        fingerprint = corpus_fingerprint(self.corpus_path)
        self.index_path = index_dir(f"bm25-{fingerprint[:16]}-k1={k1}-b={b}-v{INDEX_FORMAT}")
        self.built_index = ensure_cache(
            self.index_path,
            lambda: build_atomically(self.index_path, self._build),
            "BM25 index",
            require_files(COMPLETE_MARKER),
            load=self._load,
        )

    def _load(self) -> None:
        self._bm25 = bm25s.BM25.load(self.index_path, show_progress=False)
        self._table = PassageTable.load(self.index_path / PASSAGES_FILE)
        self.num_passages = len(self._table)

    def _build(self, out: Path) -> None:
        log.info("building BM25 index for %s into %s", self.corpus_path, self.index_path)
        passages = load_corpus(self.corpus_path)
        corpus_tokens = bm25s.tokenize(
            [passage_text(p) for p in passages], stopwords="en", stemmer=_stemmer(), show_progress=False
        )
        bm25 = bm25s.BM25(k1=self.k1, b=self.b)
        bm25.index(corpus_tokens, show_progress=False)
        bm25.save(out, show_progress=False)
        PassageTable.from_passages(passages).save(out / PASSAGES_FILE)
        write_manifest(out)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-`k` passages per query, best first; passages sharing no term with a query are left out."""
        k = min(k, self.num_passages)
        if not queries or k < 1:
            return [[] for _ in queries]
        tokens = [[t for t in q if t in self._bm25.vocab_dict] for q in tokenize(queries)]
        hits: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, t in enumerate(tokens) if t]
        if not live:
            return hits
        docs, scores = self._bm25.retrieve(
            [tokens[i] for i in live], k=k, n_threads=self.n_threads, show_progress=False
        )
        for i, row_docs, row_scores in zip(live, docs, scores, strict=True):
            hits[i] = self._passages(row_docs, row_scores)
        return hits

    def _passages(self, doc_ids: np.ndarray, scores: np.ndarray) -> list[Passage]:
        return [
            self._table.passage(d, float(s))
            for d, s in zip(doc_ids.tolist(), scores.tolist(), strict=True)
            if s > 0
        ]
